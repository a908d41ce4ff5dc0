"""A server whose text holds lone surrogates (``"\\ud800"`` in a chat message, an author name,
a push and a method name): ``mcplive run`` keeps running, prints each with U+FFFD where the
surrogate was, stores it so, and ``mcplive history`` shows it; all of it written as strict
UTF-8."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.cli_helpers import child_env, mcplive
from tests.helpers import unstamped

ROOT = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path) -> Path:
    (tmp_path / "quiet.toml").write_text("", encoding="utf-8")
    server = json.dumps([sys.executable, "-m", "tests.surrogate_server"])
    path = tmp_path / "host.toml"
    path.write_text(
        f'[host]\ndata_dir = "data"\n\n[[servers]]\nid = "odd"\ncommand = {server}\n'
        f"env = {{ PYTHONPATH = {json.dumps(str(ROOT))} }}\n\n"
        '[[agents]]\nname = "Ada"\nmodel = "scripted:quiet.toml"\n',
        encoding="utf-8",
    )
    return path


def test_lone_surrogates_from_a_server_are_shown_stored_and_never_stop_the_host(
    tmp_path: Path,
) -> None:
    path = write_config(tmp_path)
    env = child_env(PYTHONIOENCODING="utf-8:strict")
    run = mcplive("run", str(path), "--duration", "20", cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr and "UnicodeEncodeError" not in run.stderr
    lines = unstamped(run.stdout)
    for wanted in [
        "odd | (push) bell \ufffd!",
        "odd odd:#room | Uma\ufffd: hello \ufffd\ufffd world",
        "odd odd:#room | Uma\ufffd: pair \U0001f600 kept",
        "? odd: notification odd/\ufffd ignored",
    ]:
        assert wanted in lines, run.stdout
    assert not any("refused" in line or "store failed" in line for line in lines), run.stdout
    assert lines[-1] == "· host stopping"

    shown = mcplive("history", "--data-dir", "data", cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr
    texts = [line.split(" ", 5)[-1] for line in shown.stdout.splitlines()]
    assert "odd: [source: odd · unscoped] bell \ufffd!" in texts
    assert (
        "odd odd:#room Uma\ufffd: [source: odd / odd:#room · room] hello \ufffd\ufffd world"
        in texts
    )
    assert "odd odd:#room Uma\ufffd: [source: odd / odd:#room · room] pair \U0001f600 kept" in texts

    as_json = mcplive("history", "--data-dir", "data", "--json", cwd=tmp_path, env=env)
    assert as_json.returncode == 0, as_json.stderr
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    inbound = [r for r in rows if r["role"] == "user"]
    assert [r["blocks"][-1]["text"] for r in inbound] == [
        "bell \ufffd!",
        "hello \ufffd\ufffd world",
        "pair \U0001f600 kept",
    ]
    assert inbound[0]["metadata"]["event_id"] == "e\ufffd1"
    assert inbound[1]["metadata"]["author"]["name"] == "Uma\ufffd"
