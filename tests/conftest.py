import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests import pgcluster

settings.register_profile(
    "ci", deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None, max_examples=50)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# Most of the suite's time is spent waiting on real subprocesses and sockets, so it runs in
# worker processes (pytest-xdist), more of them than a small machine has cores. ``-n N`` sets
# the number, ``-n0`` or ``-p no:xdist`` runs everything in this process.
WORKERS = 4


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    option = config.option
    if option.numprocesses is not None or option.collectonly or option.usepdb:
        return
    option.numprocesses = WORKERS
    if option.dist == "no":
        option.dist = "worksteal"


# A throwaway PostgreSQL (tests/pgcluster.py): one cluster per test process, started on first
# use; ``pg_dsn`` is a fresh database in it for one test. Without PostgreSQL's programs, or when
# no cluster can start, the tests that use them skip saying why; in CI (``CI`` or
# ``MCPLIVE_PG_REQUIRED`` set, as ``.ci/run`` sets the latter) they fail instead.
PG_REQUIRED = ("CI", "MCPLIVE_PG_REQUIRED")


def _pg_required() -> bool:
    return any(os.environ.get(name, "").lower() not in ("", "0", "false") for name in PG_REQUIRED)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[pgcluster.Cluster]:
    try:
        cluster = pgcluster.start()
    except pgcluster.ClusterError as exc:
        reason = f"no PostgreSQL cluster: {exc}"
        if _pg_required():
            pytest.fail(f"{reason} (required here: {' or '.join(PG_REQUIRED)} is set)")
        pytest.skip(reason)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_dsn(pg_cluster: pgcluster.Cluster) -> str:
    """The DSN of a new, empty database (gone with the cluster at the end)."""
    return pg_cluster.create_database()
