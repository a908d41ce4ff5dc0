"""mcplive's installed version, read once from the package metadata; and the names that moved.

Release 0.2.0 put the modules of :mod:`actors` into wings (``actors.cli_history`` became
:mod:`actors.cli.history`, ``actors.models.Model`` lives in :mod:`actors.models.base`). For one
release an old name still imports, with a :class:`DeprecationWarning` naming the new one:
:class:`MovedModules` answers an old module name, and a wing that was a module before answers
its old attributes through :func:`moved_attribute`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

#: The release that drops the old names.
DROPPED_IN = "0.3"

#: Old module of ``actors`` → where it lives now (both under ``actors.``).
MOVED_MODULES: dict[str, str] = {
    "agent_gate": "agent.gate",
    "agent_history": "agent.history",
    "anthropic_model": "models.anthropic",
    "calls": "link.calls",
    "channel_coalesce": "channel.coalesced",
    "channel_directory": "directory",
    "channel_envelope": "channel.envelope",
    "channel_items": "channel.items",
    "channel_publish": "channel.publish",
    "cli_check": "cli.check",
    "cli_errors": "cli.errors",
    "cli_history": "cli.history",
    "cli_rollback": "cli.rollback",
    "cli_status": "cli.status",
    "coalescer": "channel.coalescer",
    "connection": "link.connection",
    "fetcher": "references.fetcher",
    "folding": "agent.folding",
    "handshake": "link.handshake",
    "header_notice": "agent.header_notice",
    "hooks": "agent.hooks",
    "inbound": "link.inbound",
    "inference": "agent.inference",
    "link_end": "link.end",
    "link_io": "link.io",
    "link_run": "link.run",
    "logs": "cli.logs",
    "model_retry": "models.retry",
    "openai_chat": "models.openai_chat",
    "openai_model": "models.openai",
    "openai_stream": "models.openai_stream",
    "printer": "transcript.printer",
    "prompt_cache": "models.prompt_cache",
    "providers": "models.providers",
    "recall": "agent.recall",
    "reconnect": "link.reconnect",
    "rollback": "agent.rollback",
    "rollback_plan": "agent.rollback_plan",
    "scripted": "models.scripted",
    "server_requests": "link.requests",
    "serverkit_channels": "serverkit.channels",
    "serverkit_context": "serverkit.context",
    "serverkit_declare": "serverkit.declare",
    "serverkit_files": "serverkit.files",
    "serverkit_host": "serverkit.host",
    "serverkit_link": "serverkit.link",
    "serverkit_run": "serverkit.run",
    "serverkit_tools": "serverkit.tools",
    "serverkit_transport": "serverkit.transport",
    "speech": "agent.speech",
    "tally": "link.tally",
    "tools": "agent.tools",
    "transport": "link.transport",
    "turn": "agent.turn",
    "wakes": "agent.wakes",
    "web_api": "web.api",
    "web_auth": "web.auth",
    "web_feed": "web.feed",
    "web_run": "web.run",
}

#: A wing that was a module before 0.2.0 → the module now holding that module's names.
MOVED_ATTRIBUTES: dict[str, str] = {
    "actors.agent": "actors.agent.actor",
    "actors.channel": "actors.channel.actor",
    "actors.cli": "actors.cli.command",
    "actors.link": "actors.link.state",
    "actors.models": "actors.models.base",
    "actors.references": "actors.references.registry",
    "actors.transcript": "actors.transcript.lines",
    "actors.web": "actors.web.console",
}


@functools.cache
def installed_version() -> str | None:
    """The installed distribution's version, or None when mcplive runs uninstalled (from a
    source tree on ``PYTHONPATH``). The metadata is imported here, not at start: the command's
    first line (which drops an early SIGHUP) must come as soon after exec as it can."""
    from importlib import metadata

    try:
        return metadata.version("mcplive")
    except metadata.PackageNotFoundError:
        return None


def _warn(old: str, new: str, stacklevel: int) -> None:
    """Warn that ``old`` moved, pointing ``stacklevel`` frames above this function's caller
    (at the user's import or attribute, past the machinery that answered it)."""
    warnings.warn(
        f"{old} moved to {new}; the old name goes in mcplive {DROPPED_IN}",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


class MovedModules:
    """Imports ``actors.<old>`` as the module it became, with a warning: a meta path finder and
    its loader (the protocols, not ``importlib.abc``'s classes, whose import costs the command's
    start several milliseconds)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        package, _, name = fullname.rpartition(".")
        if package != "actors" or name not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)  # type: ignore[arg-type]  # a Loader by protocol

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = "actors." + MOVED_MODULES[spec.name.rpartition(".")[2]]
        _warn(spec.name, new, 2)  # (the import system's own frames are not counted)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module was imported under its new name; there is nothing more to run."""


def install_moved_modules() -> None:
    """Let old module names import (once per process)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())


def moved_attribute(package: str, name: str) -> Any:
    """``package.name`` as it was before 0.2.0 (for a wing's module ``__getattr__``): the name
    from the module that holds it now, with a warning. A submodule, or a name the old module did
    not have, raises AttributeError as usual."""
    new = MOVED_ATTRIBUTES.get(package)
    if new is None or name.startswith("__") or importlib.util.find_spec(f"{package}.{name}"):
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(new), name, _MISSING)
    if value is _MISSING:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    _warn(f"{package}.{name}", f"{new}.{name}", 3)  # past the wing's ``__getattr__``
    return value


_MISSING = object()
