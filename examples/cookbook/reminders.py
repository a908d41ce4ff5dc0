"""Reminders that survive restarts: agents set them with a tool, and each is posted into
``#reminders`` when it is due, even if the server was stopped in between.

    [[servers]]
    id = "reminders"
    command = ["python", "reminders.py", "--state", "./reminders-state"]

The state is one JSON file, ``reminders.json`` in the state folder, replaced whole (written
beside it, then renamed over it) on every change. A reminder is forgotten only once the host
has taken it, and it is sent under an id of its own, so one sent again after a crash is stored
once.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

import trio

from actors.serverkit import MCPLServer, Publish, ToolError

server = MCPLServer("reminders")
due_here = server.channel("reminders:due", label="#reminders", publish_target="root")


class Book:
    """The pending reminders (``id``, ``due`` as a Unix time, ``text``), kept in ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.items: list[dict[str, Any]] = (
            json.loads(path.read_text(encoding="utf-8")) if path.exists() else []
        )
        self.changed = trio.Event()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = self.path.with_suffix(".tmp")
        fresh.write_text(json.dumps(self.items, indent=1), encoding="utf-8")
        os.replace(fresh, self.path)
        self.changed.set()
        self.changed = trio.Event()


book: Book


@server.tool()
async def remind(text: str, minutes: float = 0) -> str:
    """Post the text into #reminders after this many minutes."""
    if not text.strip() or minutes < 0:
        raise ToolError("a reminder needs a text and minutes >= 0")
    due = time.time() + minutes * 60
    book.items.append({"id": secrets.token_hex(6), "due": due, "text": text.strip()})
    book.save()
    return f"I will post it at {time.strftime('%H:%M', time.localtime(due))}."


@server.tool()
async def pending() -> str:
    """The reminders not yet posted, soonest first."""
    items = sorted(book.items, key=lambda r: r["due"])
    lines = [f"{time.strftime('%H:%M', time.localtime(r['due']))} {r['text']}" for r in items]
    return "\n".join(lines) or "No reminders."


@server.on_ready
async def post_when_due() -> None:
    """Runs for as long as a host is connected: post what is due, then wait for the next one
    (or for a new reminder)."""
    while True:
        changed = book.changed
        for item in [r for r in book.items if r["due"] <= time.time()]:
            entry = await due_here.send(
                f"Reminder: {item['text']}", author="reminders", message_id=f"rem-{item['id']}"
            )
            if entry.get("accepted"):
                book.items.remove(item)
                book.save()
        soonest = min((r["due"] for r in book.items), default=time.time() + 3600)
        with trio.move_on_after(max(soonest - time.time(), 0.5)):
            await changed.wait()


@due_here.on_publish
def answered(publish: Publish) -> None:
    """What an agent said in #reminders: show it there."""
    publish.echo()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path, default=Path("reminders-state"))
    book = Book(parser.parse_args().state / "reminders.json")
    server.run()
