"""Wake rows of the benchmark: latency to the model call, and wake-to-reply latency (d), (e).

Every message the bench server sends carries the wall-clock time it was sent (``t=``) and its
number. The agent's scripted model says the number of the newest message it was called with; it
streams that text while it is being called, so the first ``tokens`` trace event of a call is
stamped (``TraceEvent.ts``) with the moment of the call. The scripted model says nothing when
its context ends with its own reply (messages that arrived during its last turn were stored
before that reply): such a call's moment is taken from the end of its turn, right after it. A
call saw the messages stored (``incoming``) before its turn started, and those up to the number
it said. A message's latency to the model call runs from the moment it was sent to the first
call that saw it. Counting only what was stored before the turn started can only make a
latency longer, never shorter.
"""

from __future__ import annotations

import bisect
import math
from pathlib import Path
from typing import Any

import trio

from actors import Host
from actors.host import TraceStream
from examples.bench import host as bh

AGENT = "Bench"
#: How long, once every message is answered, the last model calls are waited for.
LAST_CALL_GRACE_S = 10.0


def _number(text: str) -> int | None:
    word = text.split()[-1] if text.split() else ""
    return int(word) if word.isdigit() else None


class CallLog:
    """The agent's model calls as ``(moment, newest message number seen)``, from its trace."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, int]] = []
        self.turns: list[tuple[float, float]] = []  # (start, end) of each turn
        self.stored = -1  # the highest message number stored so far
        self._turn: list[Any] | None = None  # [newest stored at its start, moment, said, start]

    def incoming(self, n: int) -> None:
        self.stored = max(self.stored, n)

    def event(self, kind: str, ts: float, data: Any) -> None:
        turn = self._turn
        if kind == "turn-start":
            self._turn = [self.stored, None, "", ts]
        elif kind == "tokens" and turn is not None:
            turn[1] = ts if turn[1] is None else turn[1]
            turn[2] += str(data.get("delta", ""))
        elif kind in ("turn-end", "turn-aborted") and turn is not None:
            said = _number(turn[2])
            newest = max(turn[0], -1 if said is None else said)
            self.calls.append((ts if turn[1] is None else turn[1], newest))
            self.turns.append((turn[3], ts))
            self._turn = None

    def during_turns(self, moments: Any) -> int:
        """How many of ``moments`` fall while a turn was running."""
        return sum(1 for at in moments if any(start <= at <= end for start, end in self.turns))

    @property
    def newest(self) -> int:
        return max((n for _, n in self.calls), default=-1)


def to_model_call(sent: dict[int, float], calls: list[tuple[float, int]]) -> list[float]:
    """For each message (number -> time sent), the time to the first call (moment, newest
    message number) made after it whose newest message is that one or a later one."""
    calls = sorted(calls)
    moments = [at for at, _ in calls]
    # newest[k]: the highest message number any of the calls up to k had seen
    newest: list[int] = []
    for _, n in calls:
        newest.append(max(n, newest[-1]) if newest else n)
    out = []
    for n, at in sorted(sent.items()):
        k = bisect.bisect_left(newest, n, lo=bisect.bisect_left(moments, at))
        if k < len(calls):
            out.append(calls[k][0] - at)
    return out


async def run_model_latency(
    workdir: Path, messages: int, rate: float, probe: int
) -> dict[str, Any]:
    """Latency to the model call at ``rate`` messages per second offered on one server.

    ``probe == 0``: every message is in an open channel and wakes the agent, so turns run back
    to back and a message mostly arrives while one is running. ``probe == K``: the load goes to
    a closed channel (stored for the agent, waking nobody) and every K-th message to an open
    one; those probes wake an agent that is idle, and only they are counted. The agent's prose
    is not published (``prose_mode = "disabled"``): a turn stores its reply and its receipt and
    sends nothing.
    """
    args = ["--messages", str(messages), "--rate", str(rate), "--window", str(messages)]
    if probe:
        args += ["--closed", "--probe-every", str(probe)]
    cfg = bh.config(
        workdir / "data",
        [bh.server("bench", *args)],
        [bh.agent(AGENT, bh.model(workdir, "says", bh.SAYS_INDEX), prose_mode="disabled")],
    )
    sent: dict[int, float] = {}
    decided: list[float] = []
    log = CallLog()
    kinds = {"incoming", "tokens", "turn-start", "turn-end", "turn-aborted", "server-log"}
    kinds |= {"disconnected", "trace-dropped"}
    dropped = 0
    async with Host.open(cfg) as host:
        with trio.CancelScope() as waiting:  # once all is answered, the last calls' grace
            async for event in host.trace(kinds=kinds):
                if event.kind == "incoming":
                    words = str(event.data.get("text", "")).split()
                    n = _number(" ".join(words[:3]))
                    if n is not None and words[0].startswith("t="):
                        log.incoming(n)
                        if not probe or event.channel_id == "bench:#probe":
                            sent[n] = float(words[0][2:])
                            decided.append(event.ts - sent[n])
                elif event.kind == "trace-dropped":
                    dropped += int(event.data.get("count", 0))
                elif event.agent == AGENT:
                    log.event(event.kind, event.ts, event.data)
                elif waiting.deadline == math.inf and bh.done_seconds(event) is not None:
                    waiting.deadline = trio.current_time() + LAST_CALL_GRACE_S
                elif event.kind == "disconnected" and waiting.deadline == math.inf:
                    raise RuntimeError(f"bench server failed: {event.data}")
                if waiting.deadline != math.inf and log.newest >= max(sent, default=0):
                    break
    return {
        "latencies": to_model_call(sent, log.calls),
        "decided": decided,
        "calls": len(log.calls),
        "during_turns": log.during_turns(sent.values()),
        "dropped": dropped,
    }


REPLY_RULES = "[[rules]]\nwhen = 't=(\\S+)'\nsay = \"re {1}\"\n"  # names what it answers
FLOODED = "Flo"  # the agent hearing the flooding server (silent)


async def run_replies(
    workdir: Path, agents: int, messages: int, rate: float, flood: int = 0
) -> list[float]:
    """Wake-to-reply latencies: ``agents`` agents hear one channel receiving ``messages`` at
    ``rate`` per second and answer each turn's newest message; a latency runs from the moment
    the server sent that message to the moment its answer was published. With ``flood``, a
    second server pipelines that many ``push/event`` requests at once, heard by an agent of its
    own, for the whole run."""
    reply = bh.model(workdir, "reply", REPLY_RULES)
    paced = ["--messages", str(messages), "--rate", str(rate), "--window", str(messages)]
    servers = [bh.server("bench", *paced)]
    cfg_agents = [bh.agent(f"Agent{i}", reply, ["bench"]) for i in range(agents)]
    if flood:
        servers.append(
            bh.server("flood", "--push", "--messages", str(flood), "--window", str(flood))
        )
        cfg_agents.append(bh.agent(FLOODED, bh.model(workdir, "silent", bh.SILENT), ["flood"]))
    latencies: list[float] = []
    async with Host.open(bh.config(workdir / "data", servers, cfg_agents)) as host:
        async for event in host.trace(kinds={"published", "server-log", "disconnected"}):
            if event.kind == "published" and event.agent != FLOODED:
                sent = float(str(event.data["text"]).split()[1])
                latencies.append(event.ts - sent)
            elif event.server_id == "bench" and bh.done_seconds(event) is not None:
                break  # every message answered; the flood (if any) is cut short here
            elif event.kind == "disconnected" and event.server_id == "bench":
                raise RuntimeError(f"bench server failed: {event.data}")
    if not latencies:
        raise RuntimeError("no reply was published")
    return latencies


async def first_call(trace: TraceStream, agent: str, timeout: float = 600) -> float:
    """The moment of the agent's next model call that says something (its first streamed
    piece), read from ``trace`` (subscribed before the call was caused; ``kinds`` must hold
    ``tokens``); the store rows use it with :data:`examples.bench.host.SAYS_INDEX`."""
    with trio.fail_after(timeout):
        async for event in trace:
            if event.kind == "tokens" and event.agent == agent:
                return event.ts
    raise RuntimeError("trace ended")
