"""A server that registers its channel right after answering ``initialize`` and reads nothing
more until that request is answered (as mcpl-editor does) is served on its first link; and a
server that connects but never becomes ready is dialled again later each time.

All run ``tests.editor_like_server`` as a real stdio subprocess. The first two run on the real
clock with a generous deadline and assert order only. The last moves a MockClock only where it
says (past the handshake's deadline, past each backoff), once the server shows on its stderr
(a ``server-log`` event) that it holds the host's ``featureSets/update``: the store's writer
thread makes an autojumping clock unusable, so it jumps by itself only after ``HANG_S`` real
seconds with every task blocked.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from actors import Host
from actors.link.connection import BACKOFF_BASE_S, BACKOFF_CAP_S, HEALTHY_AFTER_S
from actors.trace import TraceEvent
from actors.transcript.lines import format_event
from tests.editor_like_server import ROOM
from tests.editor_like_server import server_config as editor
from tests.helpers import config, scripted, wait_trace

pytestmark = pytest.mark.slow

NOTED = '[[rules]]\nwhen = "."\nsay = "noted"\n'
HANG_S = 10.0
TIMEOUT_S = 60.0  # the handshake's deadline, as by default
SILENT = 7  # launches that never become ready: the 7th retry's ceiling is the cap (5 s * 2**6)


def logged(text: str) -> Callable[[TraceEvent], bool]:
    return lambda e: e.kind == "server-log" and text in str(e.data.get("line"))


async def test_a_server_that_registers_at_once_is_served_on_its_first_link(
    tmp_path: Path,
) -> None:
    agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", NOTED)}]
    seen: list[TraceEvent] = []
    with trio.fail_after(60):
        async with Host.open(config(tmp_path, [editor()], agents)) as host:
            stream = host.trace()
            end = await wait_trace(
                stream,
                lambda e: e.server_id == "editor" and e.kind in ("ready", "disconnected"),
                "the end of the handshake",
                seen,
            )
            assert end.kind == "ready", format_event(end)
            opened = await host.execute_tool_call("Ada", "editor--open_file", {"path": "a.md"})
            assert not opened["is_error"], opened
            assert [b["text"] for b in opened["content"]] == ["opened a.md"]
            await wait_trace(
                stream, lambda e: e.kind == "published" and e.agent == "Ada", "Ada's reply", seen
            )
    lines = [format_event(e) for e in seen]
    order = [
        f"· editor registered {ROOM} (#notes)",
        "· editor ready: MCPL; open_file, quit",
        f"editor {ROOM} | Uma: please review a.md",
        f"editor {ROOM} | Ada → noted",
    ]
    assert [line for line in lines if line in order] == order
    answered = [e.data["line"] for e in seen if logged("channels/register answered")(e)]
    results = [{"id": ROOM, "accepted": True}]
    assert answered == [f"[editor] channels/register answered: {{'results': {results}}}"]
    # one link: no refusal, no reconnect
    assert [e.kind for e in seen if e.kind in ("connecting", "disconnected", "refused")] == [
        "connecting"
    ]


async def test_a_message_sent_while_the_handshake_finishes_is_heard_and_answered(
    tmp_path: Path,
) -> None:
    """The server sends a chat message as soon as its register is accepted and waits for its
    answer before it reads our ``featureSets/update``: the message is taken under the grant in
    force, and Ada's reply waits for the end of the handshake instead of failing."""
    agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", NOTED)}]
    seen: list[TraceEvent] = []
    with trio.fail_after(60):
        async with Host.open(config(tmp_path, [editor("--greet")], agents)) as host:
            stream = host.trace()
            await wait_trace(
                stream, lambda e: e.kind == "published" and e.agent == "Ada", "Ada's reply", seen
            )
    lines = [format_event(e) for e in seen]
    order = [f"· editor registered {ROOM} (#notes)", "· editor ready: MCPL; open_file, quit"]
    assert [line for line in lines if line in order] == order
    assert f"editor {ROOM} | Uma: hello" in lines
    assert lines[-1] == f"editor {ROOM} | Ada → noted"  # delivered
    greeted = [e.data["line"] for e in seen if logged("greeting answered")(e)]
    assert greeted == [
        "[editor] greeting answered: {'results': [{'messageId': 'm-greet', 'accepted': True}]}"
    ]
    assert [e.kind for e in seen if e.kind in ("connecting", "disconnected", "refused")] == [
        "connecting"
    ]


async def test_a_server_that_never_becomes_ready_backs_off_further_each_time(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    launches = tmp_path / "launches"
    server = editor(
        "--silent-launches", str(SILENT), "--launches", str(launches), request_timeout_s=TIMEOUT_S
    )
    agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", "")}]
    mock_clock.autojump_threshold = HANG_S
    gone: list[TraceEvent] = []
    with trio.fail_after(7200):
        async with Host.open(config(tmp_path, [server], agents), status_file=False) as host:
            stream = host.trace(kinds={"server-log", "ready", "disconnected"})

            async def ended(attempt: int) -> None:
                """The link ended, counted as retry ``attempt``; let its backoff pass."""
                event = await wait_trace(stream, lambda e: e.kind == "disconnected", "its end")
                gone.append(event)
                assert event.data["attempt"] == attempt, format_event(event)
                mock_clock.jump(event.data["retry_in_s"] + 1)

            async def ready() -> None:
                event = await wait_trace(
                    stream, lambda e: e.kind in ("ready", "disconnected"), "ready"
                )
                assert event.kind == "ready", format_event(event)

            for n in range(1, SILENT + 1):  # each connects, answers initialize, then nothing
                await wait_trace(stream, logged("holding featureSets/update"), "the update held")
                mock_clock.jump(TIMEOUT_S)
                await ended(n)
            # ready, but not for long: one more failure
            await ready()
            await host.execute_tool_call("Ada", "editor--quit", {})
            await ended(SILENT + 1)
            # ready for a while: the count starts again
            await ready()
            mock_clock.jump(HEALTHY_AFTER_S)
            await host.execute_tool_call("Ada", "editor--quit", {})
            await ended(1)
    attempts = [e.data["attempt"] for e in gone]
    assert attempts == [*range(1, SILENT + 2), 1]
    failing = [e.data["retry_in_s"] for e in gone[:-1]]
    # each wait is drawn from [ceiling/2, ceiling], the ceiling doubling up to the cap: below
    # the cap the waits grow; the last two retries wait at the cap, jitter aside
    below_cap = failing[: SILENT - 1]
    assert below_cap == sorted(below_cap) and below_cap[0] < below_cap[-1]
    assert all(BACKOFF_CAP_S / 2 <= wait <= BACKOFF_CAP_S for wait in failing[SILENT - 1 :])
    assert gone[-1].data["retry_in_s"] <= BACKOFF_BASE_S  # the first retry's wait again
    assert [e.data["step"] for e in gone] == ["featureSets/update"] * SILENT + [None, None]
    lines = [(format_event(e) or "").splitlines()[0] for e in gone]  # not the stderr tail
    assert lines[0].startswith(
        "! editor disconnected (the handshake timed out after 60s during featureSets/update); "
        "reconnecting in "
    )
    assert [line.rsplit("s (", 1)[-1] for line in lines] == [
        *(f"attempt {n})" for n in range(1, SILENT + 2)),
        "attempt 1)",
    ]
