"""The toolkit lobby (``examples/lobby_kit.py``) held to the hand-written lobby's own tests
(``tests/test_lobby_server.py``): every one of them runs unchanged, with the toolkit lobby
started in place of the old one (the same command line, the same control link), except those
in :data:`DIFFERENT`, which assert a wire detail the toolkit answers otherwise."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from examples import lobby_kit
from tests import test_lobby_server as spec

#: the old lobby's tests the toolkit lobby does not pass, and why: each asserts a wire detail
#: where the toolkit answers otherwise
DIFFERENT = {
    # the toolkit advertises tools.listChanged, and lists a feature set's uses sorted
    "test_handshake_object_form_registration_and_clean_exit": "tools capability, uses order",
    "test_handshake_array_form_and_degradation_receipts": "uses order",
    # the toolkit reads a featureSets/update notification as narrowing only (SPEC 6.7)
    "test_fsu_notification_only": "a notification does not grant",
    # the toolkit answers a line that is not JSON with -32700 (JSON-RPC 2.0 section 5.1)
    "test_bad_input_is_logged_and_survived": "parse errors are answered",
    # the toolkit leaves out an empty tags list
    "test_scripted_people_talk_and_the_clock_chimes": "no empty tags member",
}
PORTED = tuple(name for name in dir(spec) if name.startswith("test_") and name not in DIFFERENT)


@asynccontextmanager
async def kit_process(*args: str, run_id: str | None = "") -> AsyncIterator[spec.Lobby]:
    """As :func:`tests.test_lobby_server.lobby_process`, with ``examples.lobby_kit``."""
    tagged = [] if run_id is None else ["--run-id", run_id]
    with tempfile.TemporaryFile() as stderr:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "examples.lobby_kit", *tagged, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=spec.ROOT,
        )
        try:
            yield spec.Lobby(proc, stderr)
        finally:
            if proc.returncode is None:
                proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
                await proc.stdin.aclose()  # type: ignore[union-attr]
                await proc.stdout.aclose()  # type: ignore[union-attr]


def _cases() -> list[tuple[str, dict[str, object]]]:
    """Each ported test, once per parameter set where the old test is parametrized."""
    out: list[tuple[str, dict[str, object]]] = []
    for name in PORTED:
        marks = getattr(getattr(spec, name), "pytestmark", [])
        params = [m for m in marks if m.name == "parametrize"]
        if not params:
            out.append((name, {}))
            continue
        argnames, values = params[0].args[0], params[0].args[1]
        keys = [k.strip() for k in argnames.split(",")] if isinstance(argnames, str) else argnames
        for value in values:
            value = value.values if hasattr(value, "values") else value
            row = value if len(keys) > 1 else (value,)
            out.append((name, dict(zip(keys, row, strict=True))))
    return out


@pytest.mark.parametrize(("name", "kwargs"), _cases())
async def test_the_toolkit_lobby_passes_the_old_lobby_test(
    name: str, kwargs: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spec, "lobby_process", kit_process)
    monkeypatch.setattr(spec, "serve_ws", lobby_kit.serve_ws)
    await getattr(spec, name)(**kwargs)
