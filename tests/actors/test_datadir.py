"""One running host per data directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.datadir import LOCK_NAME, DataDirLock, holder
from actors.errors import DataDirBusy


def test_a_second_lock_is_refused_naming_the_holder(tmp_path: Path) -> None:
    assert holder(tmp_path) is None
    with DataDirLock(tmp_path):
        assert holder(tmp_path) == os.getpid()
        with pytest.raises(DataDirBusy) as caught:
            DataDirLock(tmp_path).acquire()
        assert caught.value.pid == os.getpid()
        assert f"pid {os.getpid()}" in str(caught.value)
    assert holder(tmp_path) is None  # released: the file stays, its pid is stale
    assert (tmp_path / LOCK_NAME).exists()
    with DataDirLock(tmp_path):
        pass


def test_the_lock_dies_with_its_process(tmp_path: Path) -> None:
    code = (
        "import sys, pathlib; from actors.datadir import DataDirLock; "
        "DataDirLock(pathlib.Path(sys.argv[1])).acquire(); print('held', flush=True); "
        "sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        assert holder(tmp_path) == child.pid
        child.kill()
        child.wait(timeout=60)
        assert holder(tmp_path) is None
        DataDirLock(tmp_path).acquire()
    finally:
        child.kill()
        child.wait(timeout=60)


async def test_two_hosts_on_one_data_dir(tmp_path: Path) -> None:
    from actors import Host

    cfg = {"host": {"data_dir": str(tmp_path / "data")}, "agents": []}
    model = tmp_path / "m.toml"
    model.write_text("")
    cfg["agents"] = [{"name": "Ada", "model": f"scripted:{model}"}]
    async with Host.open(cfg):
        with pytest.raises(DataDirBusy):
            async with Host.open(cfg):
                pass  # pragma: no cover
    async with Host.open(cfg):  # the first one let go
        pass
