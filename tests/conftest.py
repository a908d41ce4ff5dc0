import os

import pytest
from hypothesis import HealthCheck, settings

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


@pytest.fixture(scope="session")
def pg_cluster():
    """A throwaway PostgreSQL cluster for the session (see tests/pg.py); skipped, saying why,
    where none can be started, but failed when ``CI`` is set."""
    from tests.pg import start_cluster

    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_dsn(pg_cluster):
    """The DSN of a new, empty PostgreSQL database, dropped after the test."""
    dsn = pg_cluster.fresh_database()
    try:
        yield dsn
    finally:
        pg_cluster.drop(dsn)
