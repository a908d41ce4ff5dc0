"""The toolkit lobby (``examples/lobby_kit.py``) held to the hand-written lobby's own tests
(``tests/test_lobby_server.py``): each test named here runs unchanged, with the toolkit lobby
started in place of the old one (the same command line, the same control link)."""

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

#: the old lobby's tests the toolkit lobby passes as they are
PORTED = (
    "test_publish_root_channel_honours_null_and_refuses_threads",
    "test_publish_exact_channel_honours_known_threads_only",
    "test_publish_undeclared_channel_refuses_any_thread_id",
    "test_publish_invalid_thread_values_are_refused",
    "test_publish_echo_thread_modes",
    "test_publish_notification_with_thread_id_is_refused_as_a_problem",
    "test_outgoing_chunks_one_index_counter_per_inference",
    "test_outgoing_thread_ids_only_where_a_target_is_declared",
    "test_outgoing_complete_once_per_inference_and_channel",
    "test_typing_is_validated",
    "test_coalescing_advertisement_is_recorded",
    "test_render_modes",
    "test_render_params_are_validated",
    "test_incoming_with_event_id_and_coalesce",
    "test_incoming_coalesce_withheld_unless_advertised_or_forced",
    "test_push_response_carries_the_coalesce_result",
    "test_mcp_only_has_no_mcpl_but_still_registers",
    "test_render_is_mcpl_only",
    "test_share_carries_coalesce_when_advertised",
    "test_websocket_sessions_are_independent",
    "test_websocket_bearer_token",
    "test_serve_ws_in_process",
)


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
