"""The benchmark: ``python -m examples.bench [--quick]`` from a clone (also ``tox -e bench``).

:mod:`examples.bench.main` runs the rows and says what each measures; the others are its parts:
the thinnest host (:mod:`~examples.bench.ingest`), wakes and replies (:mod:`~examples.bench.wakes`),
scale (:mod:`~examples.bench.scale`), marking (:mod:`~examples.bench.marking`), the stdio server
they load (:mod:`~examples.bench.server`) and what they share (:mod:`~examples.bench.host`).
"""
