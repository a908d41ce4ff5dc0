"""The table of today's public MCPL servers in the servers guide names only config keys that
exist and test servers that are in the repository: an operator can trust what it says."""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from actors.config import ServerConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide" / "servers.md"


def rows() -> list[list[str]]:
    text = GUIDE.read_text(encoding="utf-8")
    table = text.split("## Connecting existing MCPL servers", 1)[1].split("\n\n")[2]
    lines = [line for line in table.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_every_public_server_is_listed_with_a_test_server_that_exists() -> None:
    names = [row[0] for row in rows()]
    for server in ("mcpl-editor", "discord-mcpl", "heartbeat-mcpl", "toy server"):
        assert any(server in name for name in names), server
    for _, _, tested in rows():
        paths = re.findall(r"`(tests/[\w/]+\.py)`", tested)
        assert paths or "mcp-server-time" in tested
        for path in paths:
            assert (ROOT / path).is_file(), path


def test_every_key_the_table_names_is_a_server_key_that_loads(tmp_path: Path) -> None:
    keys = {f.name for f in attrs.fields(ServerConfig)}
    for _, needs, _ in rows():
        for key, value in re.findall(r"`(\w+) = ([^`]+)`", needs):
            assert key in keys, key
            (tmp_path / "quiet.toml").write_text("", encoding="utf-8")
            server = (
                f'[[servers]]\nid = "s"\ncommand = ["x"]\n{key} = {value}\n\n'
                '[[agents]]\nname = "Ada"\nmodel = "scripted:quiet.toml"\n'
            )
            path = tmp_path / "host.toml"
            path.write_text(server, encoding="utf-8")
            loaded = load_config(path).servers[0]
            assert getattr(loaded, key), key  # the value in the table is taken as it reads
