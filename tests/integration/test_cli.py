"""The ``mcplive`` command as a user runs it: real processes, real files."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

pytestmark = pytest.mark.slow

MCPLIVE = [sys.executable, "-m", "actors.cli"]
ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MCPLIVE, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


async def test_bundled_example_talks_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    with trio.fail_after(90):
        proc = await trio.lowlevel.open_process(
            [*MCPLIVE, "run"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert proc.stdout is not None
        seen = ""
        try:
            # Ada answered in #general, Grace (hybrid) in #random and, by a >>>#general line,
            # in #general too; and Ada fetched the photo Alice shared
            wanted = (
                "lobby lobby:#general | Ada → Hi there! Ada here.",
                "lobby lobby:#random | Grace → Grace is here, and so is Ada.",
                "lobby lobby:#general | Grace → Someone in #random is asking",
                "fetch_reference → ",
            )
            while not all(w in seen for w in wanted):
                chunk = await proc.stdout.receive_some(65536)
                assert chunk, f"mcplive exited early: {seen}"
                seen += chunk.decode()
        finally:
            proc.send_signal(signal.SIGINT)
            await proc.wait()
        assert proc.returncode == 0
        assert "lobby ready: MCPL" in seen
        assert "registered lobby:#general" in seen
        assert '"digest_verified":true' in seen
        assert ">>>" not in seen  # the prefix stays in Grace's context, never on the wire
    saved = list((tmp_path / "mcplive-data" / "workspace" / "refs").iterdir())
    assert [p.suffix for p in saved] == [".png"]
    assert saved[0].read_bytes().startswith(b"\x89PNG")
    history = run("history", "--json", cwd=tmp_path)
    assert history.returncode == 0
    messages = [json.loads(line) for line in history.stdout.splitlines()]
    assert {m["agent"] for m in messages} == {"Ada", "Grace"}
    for m in messages:
        assert set(m) == {"ts", "id", "agent", "role", "blocks", "metadata"}
        assert m["role"] in ("user", "assistant", "tool", "system")
    assert any(m["role"] == "assistant" for m in messages)
    assert "http://127.0.0.1" not in history.stdout  # a reference's uri is never stored
    inbound = [m for m in messages if m["role"] == "user"]
    assert all(m["metadata"]["server_id"] == "lobby" for m in inbound)
    # every inbound item starts with its stored source header
    header = inbound[0]["metadata"]["source_header"]
    assert (
        header.startswith("[source: lobby / lobby:#") and inbound[0]["blocks"][0]["text"] == header
    )
    first_text = inbound[0]["blocks"][1]["text"]
    found = run("history", "--search", first_text[:6], "--agent", "Ada", cwd=tmp_path)
    assert found.returncode == 0 and first_text in found.stdout
    assert header in run("history", "--agent", "Ada", cwd=tmp_path).stdout  # shown in history
    unfound = run("history", "--search", "[source: lobby", "--agent", "Ada", cwd=tmp_path)
    assert unfound.returncode == 0 and unfound.stdout == ""  # the search skips headers
    assert run("history", "--search", "(", "--regex", cwd=tmp_path).returncode == 2


def test_check_accepts_the_bundled_example(tmp_path: Path) -> None:
    example = ROOT / "examples" / "lobby" / "lobby.toml"
    result = run("check", str(example), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok — 1 server(s), 2 agent(s)" in result.stdout
    assert "agent Ada: scripted:" in result.stdout
    assert (
        "  agent Grace: wakes on pushes, direct messages and messages addressing it "
        "(Grace, @Grace, replies to it); other chatter is stored for its next turn"
    ) in result.stdout.splitlines()


def test_check_reports_every_problem_on_one_line_each(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[servers]]\nid = "a--b"\ncommand = ["x"]\n\n'
        '[[servers]]\nid = "web"\nurl = "http://nope"\nrequest_timeout_s = -1\n\n'
        '[[agents]]\nname = "Ada"\nmodel = "gpt:x"\ncolour = "red"\n',
        encoding="utf-8",
    )
    result = run("check", str(bad), cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert "Traceback" not in result.stdout + result.stderr
    assert any("servers[a--b].id" in line for line in lines)
    assert any("servers[web].url" in line for line in lines)
    assert any("servers[web].request_timeout_s" in line for line in lines)
    assert any("agents[Ada].colour: unknown key" in line for line in lines)
    assert any("agents[Ada].model" in line for line in lines)
    assert all(line.startswith(str(bad)) for line in lines)


def test_run_with_a_broken_config_says_so_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken.toml"
    bad.write_text("[[agents]\n", encoding="utf-8")
    result = run("run", str(bad), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "not valid TOML" in result.stderr
    missing = run("run", str(tmp_path / "nope.toml"), cwd=tmp_path)
    assert missing.returncode == 2 and "no such file" in missing.stderr


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_config_nested_5000_deep_is_one_line(tmp_path: Path, command: str) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n", encoding="utf-8")
    result = run(command, str(deep), cwd=tmp_path)
    # run refuses it before starting; check reports it as the config's one problem
    said = result.stderr if command == "run" else result.stdout
    assert result.returncode == (2 if command == "run" else 1)
    assert said.count("\n") == 1 and "nested too deeply" in said
    assert "Traceback" not in result.stdout + result.stderr


def test_history_without_a_store_is_one_line(tmp_path: Path) -> None:
    result = run("history", "--data-dir", str(tmp_path / "none"), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().startswith("mcplive: no store at")


def _masked_config(tmp_path: Path) -> Path:
    (tmp_path / "quiet.toml").write_text("", encoding="utf-8")
    cfg = tmp_path / "masked.toml"
    cfg.write_text(
        '[[servers]]\nid = "lobby"\ncommand = ["python", "-m", "tests.lobby"]\n'
        f'env = {{ PYTHONPATH = "{ROOT}" }}\n'  # the test lobby, found from this folder
        'disabled_capabilities = ["pushEvents"]\ndisabled_feature_sets = ["lobby.chat"]\n\n'
        '[[agents]]\nname = "Ada"\nmodel = "scripted:quiet.toml"\n',
        encoding="utf-8",
    )
    return cfg


def test_check_reports_the_grant_for_a_manifest_file(tmp_path: Path) -> None:
    cfg = _masked_config(tmp_path)
    manifest = tmp_path / "lobby.json"
    manifest.write_text(
        json.dumps(
            {
                "version": "0.5",
                "pushEvents": True,
                "channels": {"register": True, "incoming": True},
                "contextHooks": {"beforeInference": True},
                "featureSets": {
                    "lobby.chat": {"description": "", "uses": ["channels.register"]},
                    "lobby.events": {"description": "", "uses": ["pushEvents"]},
                    "lobby.old": {"description": "", "uses": ["contextHooks.afterInference"]},
                },
            }
        ),
        encoding="utf-8",
    )
    result = run("check", str(cfg), "--manifest", f"lobby={manifest}", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "digest sha256:" in out
    granted = next(line for line in out.splitlines() if "granted:" in line and "not" not in line)
    assert "channels.register" in granted and "pushEvents" not in granted
    assert "inject.system" not in granted  # denied unless configured
    assert (
        "advertised but not granted: contextHooks.beforeInference.inject.system, pushEvents" in out
    )
    assert "feature set lobby.chat: disabled" in out
    assert "feature set lobby.events: capability_denied (pushEvents)" in out
    assert "feature set lobby.old: invalid_uses" in out
    bad = run("check", str(cfg), "--manifest", "nobody=x.json", cwd=tmp_path)
    assert bad.returncode == 1 and "--manifest nobody=x.json" in bad.stdout


def test_check_connect_reports_the_live_grant(tmp_path: Path) -> None:
    cfg = _masked_config(tmp_path)
    result = run("check", str(cfg), "--connect", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "server lobby (live):" in result.stdout
    assert "advertised but not granted: pushEvents" in result.stdout
    assert "feature set lobby.chat: disabled" in result.stdout
    assert not (tmp_path / "mcplive-data").exists()  # a check leaves no store behind
