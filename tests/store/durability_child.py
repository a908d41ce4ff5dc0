"""Child process for the kill -9 durability test.

Usage: ``python durability_child.py DB_PATH``. Submits appends without end (each guarded by the
dedupe key ``("event", "lobby", "e<i>")``) and prints each record id once its ``done`` callback
reports it stored, so every printed id has been acknowledged as durable. Waits for a free slot
(instead of spinning on ``StoreFull``) by bounding its own in-flight ops.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from store import Append, AppendResult, GroupCommitWriter, MessageRecord

IN_FLIGHT = 256
LIMIT = 10_000_000


def main(path: str) -> None:
    slots = threading.Semaphore(IN_FLIGHT)
    writer = GroupCommitWriter(path, max_queue=IN_FLIGHT, max_batch=64)
    writer.start()

    def done_for(record_id: str) -> Callable[[object], None]:
        def done(outcome: object) -> None:
            if outcome == AppendResult(stored=True):
                sys.stdout.write(record_id + "\n")
                sys.stdout.flush()
            else:
                sys.stderr.write(f"{record_id}: {outcome!r}\n")
            slots.release()

        return done

    for i in range(LIMIT):
        record_id = f"m{i}"
        op = Append(
            records=(
                MessageRecord(
                    id=record_id,
                    agent="alice",
                    role="user",
                    blocks=({"type": "text", "text": f"message {i}"},),
                    metadata={"event_id": f"e{i}"},
                    created_at=float(i),
                ),
            ),
            dedupe=("event", "lobby", f"e{i}"),
        )
        slots.acquire()
        writer.submit(op, done_for(record_id))
    writer.close()


if __name__ == "__main__":
    main(sys.argv[1])
