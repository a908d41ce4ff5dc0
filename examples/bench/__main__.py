"""``python -m examples.bench [--quick]``: the benchmark (:mod:`examples.bench.main`)."""

import trio

from examples.bench.main import main

if __name__ == "__main__":
    trio.run(main)
