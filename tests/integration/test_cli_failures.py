"""Where ``mcplive`` owes one readable line, it prints one line, not a traceback, and leaves the
store's bytes as they were. Each case here was once a traceback (or a wrong "ok")."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from store import Append, Database, db_path
from tests.cli_helpers import (
    MCPLIVE,
    child_env,
    make_store,
    mcplive,
    one_line,
    read_only,
    store_files,
    stored,
    tree_digest,
    unchanged_store,
)

pytestmark = pytest.mark.slow


def write_config(folder: Path, *, data_dir: str = "data", servers: str = "") -> Path:
    (folder / "quiet.toml").write_text("", encoding="utf-8")
    cfg = folder / "host.toml"
    cfg.write_text(
        f'[host]\ndata_dir = "{data_dir}"\n\n{servers}'
        '[[agents]]\nname = "Ada"\nmodel = "scripted:quiet.toml"\n',
        encoding="utf-8",
    )
    return cfg


def small_store(data_dir: Path) -> Path:
    return make_store(data_dir, [stored(f"m{i}", f"hello {i}") for i in range(3)])


# -- the config file itself -------------------------------------------------------------------


def test_a_config_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "latin1.toml"
    cfg.write_bytes('[[agents]]\nname = "Zoë"\n'.encode("latin-1"))
    for command in ("run", "check"):
        result = mcplive(command, str(cfg), cwd=tmp_path)
        out = result.stdout + result.stderr
        assert result.returncode != 0 and "Traceback" not in out
        assert f"{cfg}: not UTF-8 text (byte 21); save the config as UTF-8" in out
    assert one_line(mcplive("run", str(cfg), cwd=tmp_path)).startswith(f"mcplive: {cfg}")


def test_a_config_path_that_is_a_folder_is_one_line(tmp_path: Path) -> None:
    result = mcplive("run", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result) == (
        f"mcplive: {tmp_path}: is a folder; give the path of a TOML config file"
    )
    checked = mcplive("check", str(tmp_path), cwd=tmp_path)
    assert checked.returncode == 1 and "is a folder" in checked.stdout


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400"])
def test_non_finite_numbers_are_refused(tmp_path: Path, value: str) -> None:
    server = (
        '[[servers]]\nid = "lobby"\ncommand = ["python", "-m", "tests.lobby"]\n'
        f"request_timeout_s = {value}\nhook_timeout_s = {value}\n\n"
    )
    cfg = write_config(tmp_path, servers=server)
    result = mcplive("check", str(cfg), cwd=tmp_path)
    assert result.returncode == 1, result.stdout
    assert f"{cfg}: servers[lobby].request_timeout_s: must be a positive finite number" in (
        result.stdout.splitlines()
    )
    assert "servers[lobby].hook_timeout_s: must be a positive finite number" in result.stdout


# -- server commands --------------------------------------------------------------------------


def test_check_says_a_server_command_is_not_found(tmp_path: Path) -> None:
    servers = (
        '[[servers]]\nid = "gone"\ncommand = ["mcplive-no-such-program", "--stdio"]\n\n'
        '[[servers]]\nid = "local"\ncommand = ["bin/missing-server"]\n\n'
        '[[servers]]\nid = "script"\ncommand = ["python", "servers/missing.py"]\n\n'
        '[[servers]]\nid = "fine"\ncommand = ["python", "-m", "tests.lobby"]\n\n'
    )
    cfg = write_config(tmp_path, servers=servers)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = mcplive("check", str(cfg), cwd=elsewhere)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines == [
        f"{cfg}: servers[gone].command: program 'mcplive-no-such-program' not found on PATH",
        f"{cfg}: servers[local].command: bin/missing-server not found (looked for "
        f"{tmp_path / 'bin' / 'missing-server'})",
        f"{cfg}: servers[script].command: python script servers/missing.py not found (looked "
        f"for {tmp_path / 'servers' / 'missing.py'})",
    ]


def test_check_reports_every_problem_in_one_pass(tmp_path: Path) -> None:
    """A missing server command is reported beside the config's other problems, not only once
    they are fixed; so are the data dir and a console token variable that is not set."""
    (tmp_path / "data").write_text("not a folder", encoding="utf-8")
    servers = (
        '[[servers]]\nid = "gone"\ncommand = ["mcplive-no-such-program"]\nrequest_timeout = 5\n\n'
        '[[servers]]\nid = "fine"\ncommand = ["python", "-m", "tests.lobby"]\n\n'
        '[[servers]]\nid = "missing"\ncommand = ["bin/missing-server"]\n\n'
    )
    cfg = write_config(tmp_path, servers=servers)
    text = cfg.read_text(encoding="utf-8").replace(
        "[host]\n", '[host]\nweb_token_env = "NO_SUCH_TOKEN_VAR"\n'
    )
    cfg.write_text(text + 'colour = "red"\n', encoding="utf-8")
    env = child_env(NO_SUCH_TOKEN_VAR=None)
    result = mcplive("check", str(cfg), cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{cfg}: servers[gone].request_timeout: unknown key; did you mean request_timeout_s?",
        f"{cfg}: agents[Ada].colour: unknown key; see the README for agent keys",
        f"{cfg}: servers[gone].command: program 'mcplive-no-such-program' not found on PATH",
        f"{cfg}: servers[missing].command: bin/missing-server not found (looked for "
        f"{tmp_path / 'bin' / 'missing-server'})",
        f"{cfg}: host.data_dir {tmp_path / 'data'}: is a file, not a folder; give a folder "
        "(made when missing)",
        f"{cfg}: host.web_token_env: NO_SUCH_TOKEN_VAR is not set (or empty); set it to the "
        "console's access token, or remove web_token_env",
    ]


def test_check_refuses_a_console_token_variable_that_run_refuses(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    text = cfg.read_text(encoding="utf-8").replace(
        "[host]\n", '[host]\nweb = "127.0.0.1:0"\nweb_token_env = "NO_SUCH_TOKEN_VAR"\n'
    )
    cfg.write_text(text, encoding="utf-8")
    env = child_env(NO_SUCH_TOKEN_VAR=None)
    line = (
        "host.web_token_env: NO_SUCH_TOKEN_VAR is not set (or empty); set it to the console's "
        "access token, or remove web_token_env"
    )
    assert one_line(mcplive("run", str(cfg), cwd=tmp_path, env=env)) == f"mcplive: {line}"
    checked = mcplive("check", str(cfg), cwd=tmp_path, env=env)
    assert checked.returncode == 1
    assert checked.stdout.splitlines() == [f"{cfg}: {line}"]
    fine = mcplive("check", str(cfg), cwd=tmp_path, env=child_env(NO_SUCH_TOKEN_VAR="t0ken"))
    assert fine.returncode == 0, fine.stdout


def test_check_finds_commands_where_the_host_would(tmp_path: Path) -> None:
    # relative paths from the config's folder (not the current one), bare names on PATH
    program = tmp_path / "bin" / "server"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\n", encoding="utf-8")
    program.chmod(0o755)
    (tmp_path / "srv.py").write_text("", encoding="utf-8")
    servers = (
        '[[servers]]\nid = "local"\ncommand = ["bin/server"]\n\n'
        '[[servers]]\nid = "script"\ncommand = ["python", "srv.py"]\n\n'
        '[[servers]]\nid = "shell"\ncommand = ["sh", "-c", "true"]\n\n'
    )
    cfg = write_config(tmp_path, servers=servers)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = mcplive("check", str(cfg), cwd=elsewhere)
    assert result.returncode == 0, result.stdout
    program.chmod(0o644)
    result = mcplive("check", str(cfg), cwd=elsewhere, unprivileged=True)
    assert f"servers[local].command: {program} is not executable" in result.stdout


# -- the data dir -----------------------------------------------------------------------------


def test_a_data_dir_that_is_a_file_is_one_line_for_run_rollback_and_check(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("not a folder", encoding="utf-8")
    cfg = write_config(tmp_path)
    before = tree_digest(tmp_path)
    expected = (
        f"mcplive: data_dir {tmp_path / 'data'}: is a file, not a folder; give a folder (made "
        "when missing)"
    )
    assert one_line(mcplive("run", str(cfg), "--duration", "1", cwd=tmp_path)) == expected
    back = mcplive("rollback", "Ada", "--to", "m1", "--config", str(cfg), cwd=tmp_path)
    assert one_line(back) == expected
    checked = mcplive("check", str(cfg), cwd=tmp_path)
    assert checked.returncode == 1
    assert checked.stdout.splitlines() == [f"{cfg}: host.{expected.removeprefix('mcplive: ')}"]
    # below a file, too
    nested = write_config(tmp_path, data_dir="data/inner")
    assert "is a file, so the folder cannot be made" in one_line(
        mcplive("run", str(nested), "--duration", "1", cwd=tmp_path)
    )
    assert tree_digest(tmp_path, skip=lambda p: p.name == "host.toml") == {
        k: v for k, v in before.items() if k != "host.toml"
    }


def test_a_data_dir_that_is_not_writable_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    small_store(data)
    cfg = write_config(tmp_path)
    before = tree_digest(data)
    with read_only(data):
        run = mcplive("run", str(cfg), "--duration", "1", cwd=tmp_path, unprivileged=True)
        assert one_line(run) == (
            f"mcplive: data_dir {data}: it is not writable by this user; give a folder this "
            "user may write to, or change its permissions"
        )
        back = mcplive(
            "rollback", "Ada", "--to", "m1", "--config", str(cfg), cwd=tmp_path, unprivileged=True
        )
        assert "is not writable by this user" in one_line(back)
        checked = mcplive("check", str(cfg), cwd=tmp_path, unprivileged=True)
        assert checked.returncode == 1 and "host.data_dir" in checked.stdout
        # history reads it all the same
        history = mcplive("history", "--data-dir", str(data), cwd=tmp_path, unprivileged=True)
        assert history.returncode == 0, history.stderr
        assert len(history.stdout.splitlines()) == 3
    assert tree_digest(data) == before
    # a store file this user may not write is refused the same way
    with read_only(data / "store.sqlite3"):
        run = mcplive("run", str(cfg), "--duration", "1", cwd=tmp_path, unprivileged=True)
        assert one_line(run) == (
            f"mcplive: data_dir {data}: {data / 'store.sqlite3'} is not writable by this user"
        )
    assert tree_digest(data) == before


# -- a read-only store ------------------------------------------------------------------------


def test_history_reads_a_store_it_may_not_write(tmp_path: Path) -> None:
    data = tmp_path / "data"
    path = small_store(data)
    before = tree_digest(data)
    with read_only(path):  # the file only: SQLite makes its WAL index beside it
        result = mcplive("history", "--data-dir", str(data), cwd=tmp_path, unprivileged=True)
    assert result.returncode == 0, result.stderr
    assert [line.split(" ", 3)[-1] for line in result.stdout.splitlines()] == [
        "Ada user hello 0",
        "Ada user hello 1",
        "Ada user hello 2",
    ]
    unchanged_store(before, tree_digest(data))
    for name in ("store.sqlite3-wal", "store.sqlite3-shm"):
        (data / name).unlink(missing_ok=True)
    with read_only(path, data):  # the folder too: nothing can be made beside the file
        result = mcplive("history", "--data-dir", str(data), cwd=tmp_path, unprivileged=True)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3
    assert tree_digest(data) == before


def test_history_of_a_read_only_copy_with_an_unindexed_wal_is_one_line(tmp_path: Path) -> None:
    # a copy taken while a host ran: committed writes only in the -wal, no -shm, and a folder
    # SQLite may not write its index to; reading the main file alone would miss those writes
    live = tmp_path / "live"
    small_store(live)
    copy = tmp_path / "copy"
    copy.mkdir()
    with Database(db_path(live)) as db:
        db.apply([Append(records=(stored("m9", "only in the wal"),))])
        for name in ("store.sqlite3", "store.sqlite3-wal"):
            shutil.copy(live / name, copy / name)
    before = tree_digest(copy)
    with read_only(copy):
        result = mcplive("history", "--data-dir", str(copy), cwd=tmp_path, unprivileged=True)
    assert one_line(result) == (
        f"mcplive: store: cannot read store {copy / 'store.sqlite3'}: its write-ahead log "
        "store.sqlite3-wal is there but the folder is read-only; copy the data dir somewhere "
        "writable and read the copy"
    )
    assert tree_digest(copy) == before
    readable = mcplive("history", "--data-dir", str(copy), cwd=tmp_path)  # once it may write
    assert readable.stdout.splitlines()[-1].endswith("m9 Ada user only in the wal")


# -- a damaged store --------------------------------------------------------------------------


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "header":
        data[:100] = b"\x5a" * 100
    elif how == "truncated":
        data = data[: len(data) // 2]
    else:  # the pages after the schema's
        page = 4096
        data[page * 2 :] = b"\xa5" * (len(data) - page * 2)
    path.write_bytes(bytes(data))


def _big_store(data: Path) -> Path:
    return make_store(data, [stored(f"m{i}", f"message {i} " + "x" * 300) for i in range(400)])


@pytest.mark.parametrize("how", ["header", "truncated", "pages"])
def test_history_of_a_damaged_store_is_one_line(tmp_path: Path, how: str) -> None:
    data = tmp_path / "data"
    path = _big_store(data)
    _damage(path, how)
    before = tree_digest(data, skip=lambda p: not store_files(p))
    result = mcplive("history", "--data-dir", str(data), cwd=tmp_path)
    assert result.returncode == 1
    line = one_line(result)
    assert line.startswith(f"mcplive: {path}: the store is damaged or is not an mcplive store (")
    assert line.endswith("move the file aside (a new, empty store is made) or restore a backup")
    unchanged_store(before, tree_digest(data, skip=lambda p: not store_files(p)))


@pytest.mark.parametrize("how", ["header", "truncated"])
def test_run_on_a_damaged_store_is_one_line(tmp_path: Path, how: str) -> None:
    data = tmp_path / "data"
    path = _big_store(data)
    _damage(path, how)
    cfg = write_config(tmp_path)
    before = tree_digest(data, skip=lambda p: not store_files(p))
    result = mcplive("run", str(cfg), "--duration", "5", cwd=tmp_path)
    assert result.returncode == 1
    assert one_line(result).startswith(f"mcplive: {path}: the store is damaged")
    assert tree_digest(data, skip=lambda p: not store_files(p)) == before


# -- output to a pipe that closes -------------------------------------------------------------


@pytest.mark.parametrize("count", [3, 2000])  # the rest fits in the pipe, or it does not
def test_history_into_head_exits_quietly(tmp_path: Path, count: int) -> None:
    data = tmp_path / "data"
    make_store(data, [stored(f"m{i}", f"message {i} " + "y" * 80) for i in range(count)])
    proc = subprocess.Popen(
        [*MCPLIVE, "history", "--data-dir", str(data)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # what `| head -1` does once it has its line
    err = proc.stderr.read().decode()
    proc.stderr.close()
    status = proc.wait(60)
    assert b"message 0" in first
    assert err == ""
    assert status in (0, 1)  # 1: the exit of Python's documented recipe, when it is needed
