"""What a host builds at start-up is kept out of the cyclic collector's full passes while it
runs (``gc.freeze``), and handed back when it closes; the thread switch interval is short while
hosts run, and put back after."""

from __future__ import annotations

import gc
from pathlib import Path

from actors import Host


async def test_start_up_objects_are_frozen_while_the_host_runs(tmp_path: Path) -> None:
    model = tmp_path / "m.toml"
    model.write_text("")
    cfg = {
        "host": {"data_dir": str(tmp_path / "data")},
        "agents": [{"name": "Ada", "model": f"scripted:{model}"}],
    }
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    async with Host.open(cfg, status_file=False) as host:
        assert gc.get_freeze_count() > 0
        # the host's context is among them: no collection walks it
        assert not any(o is host.ctx for o in gc.get_objects())
    assert gc.get_freeze_count() == 0


async def test_the_switch_interval_is_short_while_hosts_run(tmp_path: Path) -> None:
    """The store's writer thread takes the interpreter lock back sooner (actors.interpreter);
    the interval found is put back when the last host closes."""
    import sys

    import pytest

    from actors.interpreter import SWITCH_INTERVAL_S

    model = tmp_path / "m.toml"
    model.write_text("")

    def cfg(name: str) -> dict[str, object]:
        return {
            "host": {"data_dir": str(tmp_path / name)},
            "agents": [{"name": "Ada", "model": f"scripted:{model}"}],
        }

    short = pytest.approx(SWITCH_INTERVAL_S, abs=1e-6)  # kept in whole microseconds
    found = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        async with Host.open(cfg("one"), status_file=False):
            assert sys.getswitchinterval() == short
            async with Host.open(cfg("two"), status_file=False):
                assert sys.getswitchinterval() == short
            assert sys.getswitchinterval() == pytest.approx(
                SWITCH_INTERVAL_S, abs=1e-6
            )  # one host still runs
        assert sys.getswitchinterval() == 0.005
    finally:
        sys.setswitchinterval(found)
