"""The bundled lobby example: ``server.py`` (a chat server written with the toolkit), its
config ``lobby.toml`` and the scripted models of its two agents (``ada.toml``, ``grace.toml``).

A wheel carries this folder as ``actors/cli/lobby``, which ``mcplive run`` runs when given no
config; in a clone, ``mcplive run examples/lobby/lobby.toml`` runs it as edited."""
