"""Child process for the kill -9 durability tests.

Usage: ``python durability_child.py DB_PATH [--journal [START]]``. Submits appends without end (each
guarded by the dedupe key ``("event", "lobby", "e<i>")``) and prints each record id once its
``done`` callback reports it stored, so every printed id has been acknowledged as durable. Waits
for a free slot (instead of spinning on ``StoreFull``) by bounding its own in-flight ops.

With ``--journal`` append ``i`` is :func:`journal_op` instead: ``1 + i % 2`` messages and
``1 + i % 3`` journal entries, and ``m<i>`` is printed once it is stored; the appends start at
``START`` (default 0), so a restarted child can resend appends that are already stored.

The first line printed is ``store <pid>``: the process that holds the store's write connection.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from store import Append, AppendResult, GroupCommitWriter, JournalEntry, MessageRecord

IN_FLIGHT = 256
LIMIT = 10_000_000
#: The stream every journal entry of :func:`journal_op` goes to, except each fourth op's last.
STREAM = "coalesce"
OTHER_STREAM = "other"


def journal_op(i: int) -> Append:
    """Append ``i`` of the ``--journal`` mode: messages ``m<i>.<n>``, and entries
    ``{"v": 1, "i": i, "k": k}`` in :data:`STREAM` (the last one in :data:`OTHER_STREAM` when
    ``i % 4 == 0``)."""
    records = tuple(
        MessageRecord(
            id=f"m{i}.{n}",
            agent="alice",
            role="user",
            blocks=({"type": "text", "text": f"message {i}.{n}"},),
            metadata={"event_id": f"e{i}"},
            created_at=float(i),
        )
        for n in range(1 + i % 2)
    )
    count = 1 + i % 3
    journal = tuple(
        JournalEntry(
            OTHER_STREAM if i % 4 == 0 and k == count - 1 else STREAM,
            {"v": 1, "i": i, "k": k, "pad": "x" * (k * 50)},
        )
        for k in range(count)
    )
    return Append(records=records, dedupe=("event", "lobby", f"e{i}"), journal=journal)


def main(path: str, journal: bool, start: int = 0) -> None:
    slots = threading.Semaphore(IN_FLIGHT)
    writer = GroupCommitWriter(path, max_queue=IN_FLIGHT, max_batch=64)
    writer.start()
    sys.stdout.write(f"store {writer.store_pid}\n")
    sys.stdout.flush()

    def done_for(record_id: str) -> Callable[[object], None]:
        def done(outcome: object) -> None:
            if outcome == AppendResult(stored=True):
                sys.stdout.write(record_id + "\n")
                sys.stdout.flush()
            else:
                sys.stderr.write(f"{record_id}: {outcome!r}\n")
            slots.release()

        return done

    for i in range(start, LIMIT):
        record_id = f"m{i}"
        if journal:
            op = journal_op(i)
        else:
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
    journal = sys.argv[2:3] == ["--journal"]
    main(sys.argv[1], journal, int(sys.argv[3]) if journal and len(sys.argv) > 3 else 0)
