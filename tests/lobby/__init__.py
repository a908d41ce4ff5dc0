"""The test lobby: the bundled example's lobby (``examples/lobby/server.py``) with the machinery
a host's tests drive it by. Run it with ``python -m tests.lobby [options]`` from the repository's
root (``--help`` lists the options).

- :mod:`tests.lobby.server`: the lobby, its options (:mod:`~tests.lobby.options`) and its
  websocket sessions; :mod:`~tests.lobby.words` its vocabulary.
- What a test drives: the control link (:mod:`~tests.lobby.link`, :mod:`~tests.lobby.session`,
  :mod:`~tests.lobby.steering`; the test's side is :mod:`~tests.lobby.control`), the commands
  that make the lobby send (:mod:`~tests.lobby.commands`) and the answers it switches
  (:mod:`~tests.lobby.modes`, :mod:`~tests.lobby.answers`).
- How it misbehaves on purpose (:mod:`~tests.lobby.faults`) and what it checks in the host's
  behaviour (:mod:`~tests.lobby.checks`).
- What it adds to the example: thread-targeted publishes (:mod:`~tests.lobby.places`), a
  notebook with rollback modes (:mod:`~tests.lobby.notes`) and files served over HTTP
  (:mod:`~tests.lobby.files`).
"""
