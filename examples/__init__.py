"""What a reader copies from, run from a clone: the bundled lobby (``examples/lobby``, which a
wheel carries inside ``actors``) and the benchmark (``python -m examples.bench``). Not installed."""
