"""``python -m tests.integration.compaction_child MODE CONFIG``: ``mcplive run CONFIG`` with the
coalescer compacting its journal once more than :data:`EVERY` records were journaled since its
latest snapshot. In mode ``kill-before-trim`` the process SIGKILLs itself at its first
compaction, once the snapshot is durable and its seq read back, just before the trim; in mode
``run`` it compacts as usual."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from actors import cli
from actors.channel import coalescer

EVERY = 4


def _killed(**_: Any) -> Any:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("SIGKILL returned")


def main(argv: Sequence[str]) -> int:
    mode, config = argv
    coalescer.CoalescerActor.compact_every = EVERY
    if mode == "kill-before-trim":
        coalescer.TrimJournal = _killed  # type: ignore[misc]
    elif mode != "run":
        raise SystemExit(f"unknown mode {mode!r}")
    return cli.main(["run", config])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
