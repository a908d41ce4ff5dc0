"""``mcplive`` beside a running host: one host per data dir; history, check and follow work
beside it; rollback waits for it to stop. The host is a real ``mcplive run`` of the bundled
example in a subprocess."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_helpers import Running, mcplive, one_line

pytestmark = pytest.mark.slow

LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (m_[0-9a-f]+) (Ada|Grace) (\w+) ")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Path]]:
    """The bundled example running on its own data dir, past its first reply."""
    folder = tmp_path_factory.mktemp("running")
    data = folder / "data"
    running = Running("run", "--data-dir", str(data), cwd=folder)
    try:
        running.wait_for(lambda line: "Ada → Hi there! Ada here." in line, "Ada's first reply")
        yield running, data
        assert running.interrupt() == 0
    finally:
        running.close()


def test_a_second_run_on_the_same_data_dir_is_refused_naming_the_pid(
    host: tuple[Running, Path], tmp_path: Path
) -> None:
    running, data = host
    second = mcplive("run", "--data-dir", str(data), "--duration", "30", cwd=tmp_path)
    assert second.returncode == 1
    assert one_line(second) == (
        f"mcplive: data_dir {data} is in use by pid {running.pid} (a running mcplive host); "
        "stop it, or give this host another data_dir"
    )
    assert running.proc.poll() is None  # the first one runs on


def test_history_and_check_work_beside_a_running_host(
    host: tuple[Running, Path], tmp_path: Path
) -> None:
    running, data = host
    history = mcplive("history", "--data-dir", str(data), "--agent", "Ada", cwd=tmp_path)
    assert history.returncode == 0, history.stderr
    assert any("Hi there! Ada here." in line for line in history.stdout.splitlines())
    (tmp_path / "quiet.toml").write_text("", encoding="utf-8")
    cfg = tmp_path / "beside.toml"
    cfg.write_text(
        f'[host]\ndata_dir = "{data}"\n\n[[agents]]\nname = "Ada"\nmodel = "scripted:quiet.toml"\n',
        encoding="utf-8",
    )
    checked = mcplive("check", str(cfg), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"  data_dir in use by a running host (pid {running.pid})" in checked.stdout


def test_rollback_says_the_host_must_be_stopped_first(
    host: tuple[Running, Path], tmp_path: Path
) -> None:
    running, data = host
    result = mcplive("rollback", "Ada", "--to", "m_1", "--data-dir", str(data), cwd=tmp_path)
    assert result.returncode == 1
    assert one_line(result) == (
        f"mcplive: rollback: a host is running on data_dir {data} (pid {running.pid}); stop it "
        "first (rollback starts the host itself)"
    )


def test_follow_prints_what_the_host_stores_as_it_is_stored(
    host: tuple[Running, Path], tmp_path: Path
) -> None:
    _, data = host
    # --limit 0: nothing stored so far, so every line is a message stored after the start
    follow = Running("history", "--data-dir", str(data), "--limit", "0", "--follow", cwd=tmp_path)
    try:
        followed: list[str] = []
        while len(followed) < 6:
            line = follow.wait_for(lambda line: True, "a followed message")
            match = LINE.match(line)
            assert match, line
            followed.append(match[1])
        assert follow.interrupt() == 0
    finally:
        follow.close()
    assert "Traceback" not in "\n".join(follow.lines)
    stored = mcplive("history", "--data-dir", str(data), "--json", cwd=tmp_path)
    order = [json.loads(line)["id"] for line in stored.stdout.splitlines()]
    positions = [order.index(i) for i in followed]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert positions[0] > 0  # not the history from the start
