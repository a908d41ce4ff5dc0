"""Hostile peers beside a healthy agent: each case runs a live host with Ada, a healthy agent on a
scripted model, while something the host does not control misbehaves, and measures whether Ada
keeps answering and how long the host's loop was held (its ``LoopWatch``).

The cases (``CASES``); sizes are the ones found in the wild at ``scale`` 1.0:

* ``quiet``: nothing hostile; the run every other case is compared with.
* Eve's model endpoint (an OpenAI-compatible server in its own process, ``python -m
  examples.bench.hostile serve CASE SCALE``, answering every request the same way):
  ``sse-empty-lines`` (an event of 40,000 empty ``data:`` lines), ``sse-big-event`` (an event of
  36,000 ten-byte lines), ``prose-flood`` (a reply streamed to 4,000,000 characters in 64-character
  pieces), ``tool-args`` (a tool call's arguments in 50-character pieces, to 4,000,000
  characters), ``deep-json`` (an event nested 100,000 deep), ``deep-500`` (a 500 whose body is
  nested 100,000 deep; the act ends when it is retried).
* Files: ``deep-config`` (``Host.reload`` of a config nested 5,000 deep), ``fifo-config``
  (``Host.reload`` of a FIFO nobody writes), ``fifo-gate`` (Eve's gate file replaced by a FIFO).
* The console: ``console-deep-post`` (a POST nested 20,000 deep) and ``console-search`` (the
  History page's search).

:func:`run_case` returns what a test asserts (Ada's answers, the hostile acts done and what
they ended with) and what the benchmark prints (the longest loop step after the warm-up).
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from actors import Host
from actors.errors import ConfigError

MODEL_CASES = (
    "sse-empty-lines",
    "sse-big-event",
    "prose-flood",
    "tool-args",
    "deep-json",
    "deep-500",
)
FILE_CASES = ("deep-config", "fifo-config", "fifo-gate")
CONSOLE_CASES = ("console-deep-post", "console-search")
CASES = ("quiet", *MODEL_CASES, *FILE_CASES, *CONSOLE_CASES)
KEY_ENV = "MCPLIVE_HOSTILE_KEY"


def _event(payload: str) -> bytes:
    return f"data: {payload}\n\n".encode()


def _chunk(delta: str) -> bytes:
    return _event('{"choices":[{"index":0,"delta":' + delta + "}]}")


def model_response(case: str, scale: float) -> tuple[int, str, bytes]:
    """The hostile endpoint's answer to every request: status, content type, body."""
    n = max(1, int(scale * 1_000_000))
    done = _event("[DONE]")
    if case == "sse-empty-lines":
        return 200, "text/event-stream", b"data:\n" * (n // 25) + b"\n" + done
    if case == "sse-big-event":
        return 200, "text/event-stream", b"data: 0123456789\n" * (n * 36 // 1000) + b"\n" + done
    if case == "prose-flood":
        piece = _chunk('{"content":"' + "p" * 64 + '"}')
        return 200, "text/event-stream", piece * (4 * n // 64) + done
    if case == "tool-args":
        opening = '{"tool_calls":[{"index":0,"id":"c1","type":"function","function":'
        first = _chunk(opening + '{"name":"t","arguments":"{\\"x\\": \\""}}]}')
        piece = _chunk('{"tool_calls":[{"index":0,"function":{"arguments":"' + "a" * 50 + '"}}]}')
        return 200, "text/event-stream", first + piece * (4 * n // 50) + done
    if case == "deep-json":
        depth = n // 10
        return 200, "text/event-stream", _event("[" * depth + "]" * depth) + done
    if case == "deep-500":
        depth = n // 10
        return 500, "application/json", b"[" * depth + b"]" * depth
    raise ValueError(f"not a model case: {case}")


def serve(case: str, scale: float) -> None:
    """The hostile endpoint, in this process: prints its port, then answers until killed."""
    status, content_type, body = model_response(case, scale)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:
                pass  # the host gave up on the answer (a cap reached): that is its right

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


@asynccontextmanager
async def hostile_endpoint(case: str, scale: float) -> AsyncIterator[str]:
    """The base URL of a hostile endpoint process, killed when the block ends."""
    argv = [sys.executable, "-m", "examples.bench.hostile", "serve", case, str(scale)]
    async with trio.open_nursery() as nursery:
        process = await nursery.start(partial(trio.run_process, argv, stdout=-1, check=False))
        line = b""
        while not line.endswith(b"\n"):
            more = await process.stdout.receive_some(64)
            if not more:
                raise RuntimeError(f"the hostile endpoint {case} did not start")
            line += more
        try:
            yield f"http://127.0.0.1:{int(line)}/v1"
        finally:
            process.kill()
            nursery.cancel_scope.cancel()


@attrs.define
class Outcome:
    """What one case did: Ada's answers, the hostile acts done (each one's ending), and the
    longest loop step after the warm-up (with the task that took it)."""

    answers: int = 0
    acts: list[str] = attrs.Factory(list)
    longest_ms: float = 0.0
    longest_task: str | None = None
    stalls: int = 0
    running: bool = False  # the host answered once more after the hostile run


def _config(work: Path, case: str, base_url: str | None) -> Path:
    (work / "ada.toml").write_text('[[rules]]\nwhen = "."\nsay = "ok"\n', encoding="utf-8")
    (work / "eve.toml").write_text("", encoding="utf-8")
    (work / "gate.toml").write_text('default = "always"\n', encoding="utf-8")
    eve = f'model = "scripted:{work / "eve.toml"}"\ngate = "{work / "gate.toml"}"\n'
    if base_url is not None:
        eve = f'model = "openai:gpt-hostile"\nbase_url = "{base_url}"\napi_key_env = "{KEY_ENV}"\n'
    path = work / "host.toml"
    path.write_text(
        f'[host]\ndata_dir = "{work / "data"}"\n\n'
        f'[[agents]]\nname = "Ada"\nmodel = "scripted:{work / "ada.toml"}"\n\n'
        f'[[agents]]\nname = "Eve"\n{eve}',
        encoding="utf-8",
    )
    return path


def _release(fifo: Path) -> None:
    """Let a read hung on ``fifo`` end (it reads an empty file)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader waits on it


@contextmanager
def _events(host: Host, *kinds: str) -> Iterator[Any]:
    """Trace events of ``kinds`` from now on (no replay)."""
    receiver = host.ctx.trace.subscribe_nowait(kinds=frozenset(kinds))
    try:
        yield receiver
    finally:
        receiver.close()


async def _answered(host: Host, agent: str, text: str, *, retried: bool = False) -> str:
    """Post ``text`` to ``agent`` and wait for its turn to end: "answered", or its error; with
    ``retried``, only for its first retry of a failed model call (that retry's line)."""
    kinds = ("model-retry",) if retried else ("turn-end", "error")
    with _events(host, *kinds) as events:
        await host.post_local(agent, text)
        async for event in events:
            if event.agent != agent:
                continue
            if event.kind == "model-retry":
                return str(event.data["line"])
            return str(event.data.get("error", "")) if event.kind == "error" else "answered"
    raise AssertionError("the trace ended")


async def run_case(
    work: Path, case: str, *, answers: int = 20, scale: float = 1.0, read_limit_s: float = 1.0
) -> Outcome:
    """Run ``case`` (see the module): Ada answers ``answers`` local posts one after another
    while the hostile act repeats, and at least one act has ended before the run does."""
    import actors.agent.gate as gate_module
    import actors.reload as reload_module

    if case not in CASES:
        raise ValueError(f"unknown case {case!r}; one of {', '.join(CASES)}")
    kept = (reload_module.READ_LIMIT_S, gate_module.GATE_RELOAD_S, os.environ.get(KEY_ENV))
    reload_module.READ_LIMIT_S = read_limit_s
    gate_module.GATE_RELOAD_S = 0.1
    os.environ[KEY_ENV] = "sk-hostile"
    try:
        return await _run(work, case, answers, scale)
    finally:
        reload_module.READ_LIMIT_S, gate_module.GATE_RELOAD_S, key = kept
        if key is None:
            os.environ.pop(KEY_ENV, None)
        else:
            os.environ[KEY_ENV] = key


async def _run(work: Path, case: str, answers: int, scale: float) -> Outcome:
    result = Outcome()
    async with _endpoint_of(case, scale) as base_url:
        config = _config(work, case, base_url)
        async with Host.open(config, status_file=False) as host, AsyncExitStack() as stack:
            await _answered(host, "Ada", "warm up")
            act = await stack.enter_async_context(_act(work, host, case, scale))
            if case in MODEL_CASES:  # the provider's first call imports its modules: not measured
                result.acts.append(await act())
            watch = host.ctx.loop_watch  # what setting the act up cost is not measured
            watch.restart()
            acted = trio.Event()

            async def hostile() -> None:
                while True:
                    result.acts.append(await act())
                    acted.set()
                    if case == "fifo-gate":
                        return  # the gate's watch is hung on it for good

            try:
                async with trio.open_nursery() as nursery:
                    if case != "quiet":
                        nursery.start_soon(hostile)
                    else:
                        acted.set()
                    for i in range(answers):
                        if await _answered(host, "Ada", f"ping {i}") == "answered":
                            result.answers += 1
                    await acted.wait()
                    nursery.cancel_scope.cancel()
            finally:
                for fifo in ("config.fifo", "gate.toml"):
                    _release(work / fifo)
            result.longest_ms = watch.longest * 1000
            result.longest_task = watch.longest_task
            result.stalls = watch.stalls
            result.running = await _answered(host, "Ada", "still there?") == "answered"
    return result


@asynccontextmanager
async def _endpoint_of(case: str, scale: float) -> AsyncIterator[str | None]:
    if case not in MODEL_CASES:
        yield None
        return
    async with hostile_endpoint(case, scale) as url:
        yield url


@asynccontextmanager
async def _act(
    work: Path, host: Host, case: str, scale: float
) -> AsyncIterator[Callable[[], Awaitable[str]]]:
    """The hostile act of ``case``: each call does it once and says how it ended."""
    if case in CONSOLE_CASES:
        async with _console_act(host, case) as act:
            yield act
    else:
        yield _file_or_model_act(work, host, case, scale)


def _file_or_model_act(
    work: Path, host: Host, case: str, scale: float
) -> Callable[[], Awaitable[str]]:
    if case == "quiet":
        return trio.sleep_forever  # never called
    if case == "deep-500":  # retried with backoff: the act is the 500 read and retried
        return lambda: _answered(host, "Eve", "go", retried=True)
    if case in MODEL_CASES:
        return lambda: _answered(host, "Eve", "go")
    if case in ("deep-config", "fifo-config"):
        bad = work / ("deep.toml" if case == "deep-config" else "config.fifo")
        if case == "deep-config":
            depth = 5000  # past tomllib's recursion at any scale
            bad.write_text("x = " + "[" * depth + "]" * depth + "\n", encoding="utf-8")
        else:
            os.mkfifo(bad)

        async def reload() -> str:
            try:
                await host.reload(bad)
            except ConfigError as exc:
                return str(exc)
            return "reloaded"

        return reload
    if case == "fifo-gate":
        gate = work / "gate.toml"

        async def swap() -> str:
            with _events(host, "diagnostic") as events:
                gate.unlink()
                os.mkfifo(gate)
                async for event in events:
                    if event.agent == "Eve":
                        return str(event.data["text"])
            raise AssertionError("the trace ended")

        return swap
    raise ValueError(case)


@asynccontextmanager
async def _console_act(host: Host, case: str) -> AsyncIterator[Callable[[], Awaitable[str]]]:
    """The console and a client of it, opened once: only the requests are measured."""
    from actors.web.auth import ACTION_HEADER
    from actors.web.console import open_console

    async with open_console(host, "127.0.0.1:0") as console:
        headers = {ACTION_HEADER: console.guard.action_key}
        async with httpx.AsyncClient(base_url=console.url, headers=headers) as http:

            async def request() -> str:
                if case == "console-deep-post":
                    deep = b'{"text": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
                    answer = await http.post("/api/agents/Ada/post", content=deep)
                else:
                    answer = await http.get("/api/history/Ada", params={"q": "ping"})
                return f"{answer.status_code} {answer.text.strip()[:200]}"

            await request()  # the first request's own set-up is not measured either
            yield request


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], float(sys.argv[3]))
