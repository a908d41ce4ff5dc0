"""``mcplive`` options as a user gives them: ``--version``, ``run --data-dir`` with a config,
the data dir named first, ``run --web ADDR``, and ``check`` of a model whose credential is
missing."""

from __future__ import annotations

import re
import socket
from importlib.metadata import version
from pathlib import Path

import pytest

from actors.cli.command import build_parser
from tests.cli_helpers import Running, child_env, mcplive, one_line

pytestmark = pytest.mark.slow


def config(folder: Path, head: str = "", model: str = "scripted:quiet.toml") -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "quiet.toml").write_text("", encoding="utf-8")
    cfg = folder / "host.toml"
    cfg.write_text(f'{head}[[agents]]\nname = "Ada"\nmodel = "{model}"\n', encoding="utf-8")
    return cfg


def test_version(tmp_path: Path) -> None:
    result = mcplive("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout == f"mcplive {version('mcplive')}\n"


def test_run_data_dir_applies_to_a_config_that_sets_none(tmp_path: Path) -> None:
    cfg = config(tmp_path / "conf")
    result = mcplive("run", str(cfg), "--data-dir", "here", "--duration", "0.5", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "here" / "store.sqlite3").is_file()
    assert not (tmp_path / "conf" / "mcplive-data").exists()


def test_run_data_dir_with_a_config_that_sets_one_is_an_error(tmp_path: Path) -> None:
    cfg = config(tmp_path / "conf", head='[host]\ndata_dir = "mine"\n\n')
    for command in (["run", str(cfg)], ["rollback", "Ada", "--to", "m1", "--config", str(cfg)]):
        result = mcplive(*command, "--data-dir", "here", cwd=tmp_path)
        assert result.returncode == 2
        assert one_line(result) == (
            "mcplive: host.data_dir: the config sets it ('mine') and so does --data-dir "
            "('here'); give only one"
        )
    assert not (tmp_path / "here").exists() and not (tmp_path / "conf" / "mine").exists()


def test_check_names_a_missing_model_key(tmp_path: Path) -> None:
    cfg = config(tmp_path, model="anthropic:claude-sonnet-4-5")
    missing = mcplive("check", str(cfg), cwd=tmp_path, env=child_env(ANTHROPIC_API_KEY=None))
    assert missing.returncode == 1
    assert missing.stdout.splitlines() == [
        f"{cfg}: agents[Ada].model: anthropic:claude-sonnet-4-5 needs an API key; environment "
        "variable ANTHROPIC_API_KEY is not set"
    ]
    given = mcplive("check", str(cfg), cwd=tmp_path, env=child_env(ANTHROPIC_API_KEY="sk-x"))
    assert given.returncode == 0, given.stdout
    run = mcplive("run", str(cfg), cwd=tmp_path, env=child_env(ANTHROPIC_API_KEY=None))
    assert run.returncode == 2 and "ANTHROPIC_API_KEY is not set" in one_line(run)


def test_the_first_line_of_run_names_the_data_dir(tmp_path: Path) -> None:
    """``mcplive run`` (the bundled lobby) keeps its data in ./mcplive-data, a config in its
    own folder's: either way the first line printed says where."""
    cfg = config(tmp_path / "conf")
    for args, data in (
        ((), tmp_path / "mcplive-data"),
        ((str(cfg),), cfg.parent / "mcplive-data"),
        ((str(cfg), "--web", ":0"), cfg.parent / "mcplive-data"),  # before the console's line
    ):
        run = Running("run", *args, cwd=tmp_path)
        try:
            run.wait_for(lambda line: True, "the first line")
            assert run.interrupt() == 0
        finally:
            run.close()
        assert f"data in {data}" in run.lines[0], run.lines


def test_web_takes_an_address(tmp_path: Path) -> None:
    cfg = config(tmp_path / "conf")
    run = Running("run", str(cfg), "--web", ":0", cwd=tmp_path)
    try:
        line = run.wait_for(lambda line: "console at" in line, "the console line")
        assert re.search(r"· console at http://127\.0\.0\.1:(\d+)/$", line), line
        assert not line.endswith(":7340/")
        assert run.interrupt() == 0
    finally:
        run.close()
    # the address may also come before the config, or not at all (the default)
    args = build_parser().parse_args(["run", "--web", "127.0.0.1:8765", str(cfg)])
    assert (args.web, args.config) == ("127.0.0.1:8765", str(cfg))
    assert build_parser().parse_args(["run", str(cfg), "--web"]).web is not None
    assert build_parser().parse_args(["run", str(cfg)]).web is None


@pytest.mark.parametrize(
    ("value", "line"),
    [
        ("nowhere", "mcplive: --web nowhere: 'nowhere' is not HOST:PORT, e.g. '127.0.0.1:7340' "
         "(or :PORT on 127.0.0.1)"),
        (":99999", "mcplive: --web :99999: '127.0.0.1:99999' has no valid port (0-65535) (or "
         ":PORT on 127.0.0.1)"),
        ("0.0.0.0:0", "mcplive: --web 0.0.0.0:0: not a loopback address; serve the console on "
         "127.0.0.1, or set host.web_token_env to the variable holding its access token"),
    ],
)  # fmt: skip
def test_a_bad_web_address_is_one_line(tmp_path: Path, value: str, line: str) -> None:
    cfg = config(tmp_path / "conf")
    result = mcplive("run", str(cfg), "--web", value, cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == line


def test_a_busy_console_port_is_one_line_naming_it_and_the_fix(tmp_path: Path) -> None:
    cfg = config(tmp_path / "conf")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        result = mcplive("run", str(cfg), "--web", address, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert one_line(result) == (
        f"mcplive: --web {address}: {address} is in use (another mcplive, or another program, "
        "listens there); give a free one with --web HOST:PORT (--web :0 picks a free port), or "
        "stop what listens there"
    )
    cfg.write_text(f'[host]\nweb = "{address}"\n' + cfg.read_text(encoding="utf-8"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", int(address.rsplit(":", 1)[1])))
        busy.listen()
        configured = mcplive("run", str(cfg), cwd=tmp_path)
    assert configured.returncode == 2, configured.stderr
    assert one_line(configured).startswith(f"mcplive: host.web: {address} is in use")
