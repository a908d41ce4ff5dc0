"""What a host builds at start-up is kept out of the cyclic collector's full passes while it
runs (``gc.freeze``), and handed back when it closes."""

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
