"""A stdio "server" that only floods: it writes lines that are not JSON to stdout as fast as the
host reads them, and never answers anything. It stops when its stdout is closed.

``python -m tests.flood_server [TEXT]``: each line is ``TEXT <n>`` (default ``garbage``).
"""

from __future__ import annotations

import itertools
import sys


def main() -> None:
    text = sys.argv[1] if len(sys.argv) > 1 else "garbage"
    out = sys.stdout.buffer
    counter = itertools.count()
    try:
        while True:
            batch = "".join(f"{text} {next(counter)}\n" for _ in range(500))
            out.write(batch.encode())
            out.flush()
    except (BrokenPipeError, OSError):
        pass


if __name__ == "__main__":
    main()
