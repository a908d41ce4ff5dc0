"""A minimal MCPL stdio server for the benchmark.

After the handshake it registers one channel, then sends ``--messages`` ``channels/incoming``
requests, one message each, keeping at most ``--window`` unanswered (or, with ``--rate``, at that
many per second). Each message's text carries the monotonic time it was sent (``t=<seconds>``).
When every request is answered it writes ``BENCH sent=<n> seconds=<s>`` on stderr. With
``--coalesce`` every message is an edit of the same one (RFC-006: one subject).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import trio


def _line(obj: object) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--messages", type=int, default=5000)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--rate", type=float, default=0.0)
    p.add_argument("--closed", action="store_true", help="register the channel initially closed")
    p.add_argument(
        "--coalesce",
        action="store_true",
        help="every message is an edit of one message (RFC-006: one subject, a new eventId each)",
    )
    p.add_argument(
        "--push",
        action="store_true",
        help="send push/event requests (no channel) instead of channel messages",
    )
    args = p.parse_args()
    stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
    raw_stdout = trio.lowlevel.FdStream(sys.stdout.fileno())
    send_lock = trio.Lock()

    class _Out:  # the reader answers while the sender sends: one write at a time
        async def send_all(self, data: bytes) -> None:
            async with send_lock:
                await raw_stdout.send_all(data)

    stdout = _Out()
    manifest = {
        "version": "0.5",
        "channels": {"register": True, "incoming": True, "publish": True},
        "pushEvents": True,
        "featureSets": {
            "bench": {
                "description": "bench",
                "uses": [
                    "channels.register",
                    "channels.incoming",
                    "channels.publish",
                    "pushEvents",
                ],
            }
        },
    }
    answered = 0
    outstanding = trio.Semaphore(args.window)
    all_done = trio.Event()
    ready = trio.Event()
    registered = trio.Event()

    async def reader() -> None:
        nonlocal answered
        buf = b""
        while True:
            data = await stdin.receive_some(65536)
            if not data:
                return
            buf += data
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                if not raw.strip():
                    continue
                msg = json.loads(raw)
                method = msg.get("method")
                if method == "initialize":
                    caps = {"experimental": {"mcpl": manifest}}
                    await stdout.send_all(
                        _line(
                            {
                                "jsonrpc": "2.0",
                                "id": msg["id"],
                                "result": {
                                    "protocolVersion": "2024-11-05",
                                    "capabilities": caps,
                                    "serverInfo": {"name": "bench"},
                                },
                            }
                        )
                    )
                elif method == "featureSets/update":
                    if "id" in msg:
                        await stdout.send_all(
                            _line({"jsonrpc": "2.0", "id": msg["id"], "result": {"accepted": True}})
                        )
                    ready.set()
                elif method == "channels/publish" and "id" in msg:
                    result = {"delivered": True, "messageId": f"p{msg['id']}"}
                    await stdout.send_all(
                        _line({"jsonrpc": "2.0", "id": msg["id"], "result": result})
                    )
                elif "id" in msg and method is not None:
                    await stdout.send_all(
                        _line(
                            {
                                "jsonrpc": "2.0",
                                "id": msg["id"],
                                "error": {"code": -32601, "message": "no"},
                            }
                        )
                    )
                elif "id" in msg:  # an answer to one of ours
                    if msg["id"] == 1:
                        registered.set()
                    else:
                        answered += 1
                        outstanding.release()
                        if answered == args.messages:
                            all_done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await ready.wait()
        desc: dict[str, object] = {
            "id": "bench:#load",
            "type": "chat",
            "label": "load",
            "direction": "bidirectional",
            "capabilities": {"publish": {"target": "root"}},
        }
        if args.closed:
            desc["initiallyOpen"] = False
        await stdout.send_all(
            _line(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "channels/register",
                    "params": {"channels": [desc]},
                }
            )
        )
        await registered.wait()
        start = time.monotonic()
        for i in range(args.messages):
            if args.rate:
                delay = start + i / args.rate - time.monotonic()
                if delay > 0:
                    await trio.sleep(delay)
            await outstanding.acquire()
            text = f"t={time.monotonic():.6f} message {i}"
            params = {
                "messages": [
                    {
                        "channelId": "bench:#load",
                        "messageId": f"b{i}",
                        "author": {"id": "u", "name": "Load"},
                        "timestamp": "2026-01-01T00:00:00Z",
                        "content": [{"type": "text", "text": text}],
                    }
                ]
            }
            if args.coalesce:
                message = params["messages"][0]
                message["messageId"] = "subject"
                message["eventId"] = f"e{i}"
                message["coalesce"] = {"key": "message:subject", "initial": i == 0}
            method = "channels/incoming"
            if args.push:
                method = "push/event"
                params = {
                    "featureSet": "bench",
                    "eventId": f"e{i}",
                    "timestamp": "2026-01-01T00:00:00Z",
                    "payload": {"content": [{"type": "text", "text": text}]},
                }
            await stdout.send_all(
                _line({"jsonrpc": "2.0", "id": i + 2, "method": method, "params": params})
            )
        await all_done.wait()
        print(
            f"BENCH sent={args.messages} seconds={time.monotonic() - start:.6f}",
            file=sys.stderr,
            flush=True,
        )
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
