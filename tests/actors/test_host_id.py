"""A host's id: ``[host] host_id``, else one made once and kept in the data dir; shown when the
host starts, in the status file and ``mcplive status``; a change needs a restart."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from actors import Host
from actors.config import ConfigErrors, load_config
from actors.datadir import HOST_ID, HOST_ID_NAME, host_id_of
from actors.status import StatusWriter
from actors.transcript.lines import format_event
from tests.helpers import agent_configs, config, drain_ready


def test_a_configured_id_wins_and_a_made_one_is_kept(tmp_path: Path) -> None:
    assert host_id_of(tmp_path, "blue-1") == "blue-1"
    assert not (tmp_path / HOST_ID_NAME).exists()
    made = host_id_of(tmp_path, None)
    assert HOST_ID.fullmatch(made) and made == host_id_of(tmp_path, None)
    (tmp_path / HOST_ID_NAME).write_text("not an id!\n", encoding="utf-8")
    again = host_id_of(tmp_path, None)  # a damaged file: a new id, kept in its place
    assert again != made and (tmp_path / HOST_ID_NAME).read_text().strip() == again


def test_a_bad_host_id_is_one_config_line(tmp_path: Path) -> None:
    cfg = config(tmp_path, [], agent_configs(tmp_path, {"Ada": ""}))
    cfg["host"]["host_id"] = "two words"
    with pytest.raises(ConfigErrors) as caught:
        load_config(cfg)
    assert caught.value.problems == [
        "host.host_id: letters, digits, '_', '.', '-', at most 64 characters"
    ]


async def test_the_id_is_shown_where_the_host_says_who_it_is(tmp_path: Path) -> None:
    cfg = config(tmp_path, [], agent_configs(tmp_path, {"Ada": ""}))
    with trio.fail_after(60):
        async with Host.open(cfg, status_file=False) as host:
            stream = host.trace(kinds={"host-started"})
            [started] = await drain_ready(stream)
            made = host.ctx.host_id
            assert started.data["host_id"] == made
            assert (format_event(started) or "").startswith(f"· host started (host {made}): ")
            assert StatusWriter(host.ctx).body()["host_id"] == made
            cfg["host"]["host_id"] = "green-2"
            report = await host.reload(cfg)
            assert "host_id" in report["restart"] and host.ctx.host_id == made
        async with Host.open(cfg, status_file=False) as host:
            assert host.ctx.host_id == "green-2"
        del cfg["host"]["host_id"]
        async with Host.open(cfg, status_file=False) as host:
            assert host.ctx.host_id == made  # kept in the data dir
