"""A server whose feature set omits a use it exercises (``tests.omitted_use_server``): the host
says so at the handshake, when it refuses the use, and in ``mcplive check --connect``; and the
``featureSets/update`` it sends names exactly the sets it enables."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from actors import Host
from actors.config import load_config
from actors.errors import ConfigError
from actors.transcript.lines import format_event
from tests.cli_helpers import MCPLIVE, child_env
from tests.helpers import config, running_lobby, scripted, unstamped, wait_trace
from tests.integration.test_server_failures import run_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
OMITTED = ["python", "-m", "tests.omitted_use_server"]
GREETER = '[[rules]]\nwhen = "hello"\nsay = "Hi Uma"\n'

HANDSHAKE_LINE = (
    "the server advertises pushEvents, but no enabled feature set lists it in its uses "
    "(enabled: 'omit.chat'); every push/event naming it will be refused (-32002) until its "
    "uses include pushEvents"
)
REFUSAL_LINE = (
    "feature set 'omit.chat' does not list pushEvents in its uses, but the server sent "
    "push/event naming it: refused (-32002), and so will be every such call until the server "
    "adds pushEvents to the set's uses"
)
LEGACY_LINE = (
    "feature set 'omit.legacy' uses 'contextHooks.beforeInference', which is not an MCPL "
    "capability; the set cannot be enabled"
)


def omitted(record: Path | None = None) -> dict[str, Any]:
    extra = ["--record", str(record)] if record is not None else []
    return {"id": "omit", "command": [*OMITTED, *extra], "env": {"PYTHONPATH": str(ROOT)}}


def recorded(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


async def test_an_omitted_use_is_reported_at_the_handshake_and_when_refused(
    tmp_path: Path,
) -> None:
    record = tmp_path / "omit.jsonl"
    cfg = config(
        tmp_path, [omitted(record)], [{"name": "Ada", "model": scripted(tmp_path, "a", GREETER)}]
    )
    seen: list[Any] = []
    with trio.fail_after(90):
        async with Host.open(cfg) as host:
            stream = host.trace()
            await wait_trace(stream, lambda e: e.kind == "published", "Ada's reply", seen)
    mismatches = [e.data for e in seen if e.kind == "declaration-mismatch"]
    # at the handshake: the missing use, then the set no host can enable; at the refusals: one
    # line for two refused pushes
    assert [(m["problem"], m["feature_set"], m["capability"]) for m in mismatches] == [
        ("unlisted-use", "omit.chat", "pushEvents"),
        ("unknown-capability", "omit.legacy", "contextHooks.beforeInference"),
        ("unlisted-use", "omit.chat", "pushEvents"),
    ]
    assert [m["text"] for m in mismatches] == [HANDSHAKE_LINE, LEGACY_LINE, REFUSAL_LINE]
    assert mismatches[0]["feature_sets"] == ["omit.chat"]
    kinds = [e.kind for e in seen]
    assert kinds.index("declaration-mismatch") < kinds.index("ready")
    refused = [e.data for e in seen if e.kind == "refused"]
    assert [(r["method"], r["code"]) for r in refused] == [("push/event", -32002)] * 2
    # the runtime line comes right after the first refusal
    first = kinds.index("refused")
    assert seen[first + 1].kind == "declaration-mismatch"
    assert seen[first + 1].data["text"] == REFUSAL_LINE

    entries = recorded(record)
    [update] = [e["update"] for e in entries if "update" in e]
    assert update["enabled"] == ["omit.chat"]  # never the legacy set the host cannot enable
    assert "pushEvents" in update["effectiveCapabilities"]
    pushes = [e["reply"] for e in entries if e.get("answer") == "push/event"]
    assert [p["error"]["code"] for p in pushes] == [-32002, -32002]
    assert [p["error"]["data"] for p in pushes] == [
        {"capability": "pushEvents", "featureSet": "omit.chat"}
    ] * 2
    # the rest of the exchange goes on: the message is stored, Ada answers, the server has it
    [incoming] = [e["reply"] for e in entries if e.get("answer") == "channels/incoming"]
    assert incoming["result"]["results"] == [{"messageId": "m1", "accepted": True}]
    [published] = [e["publish"] for e in entries if "publish" in e]
    assert published["channelId"] == "omit:#general"
    assert [b["text"] for b in published["content"]] == ["Hi Uma"]


async def test_the_transcript_shows_both_mismatch_lines(tmp_path: Path) -> None:
    (tmp_path / "greeter.toml").write_text(GREETER, encoding="utf-8")
    path = tmp_path / "omit.toml"
    path.write_text(
        '[host]\ndata_dir = "data"\n\n'
        '[[servers]]\nid = "omit"\ncommand = ["python", "-m", "tests.omitted_use_server"]\n'
        f'env = {{ PYTHONPATH = "{ROOT}" }}\n\n'
        '[[agents]]\nname = "Ada"\nmodel = "scripted:greeter.toml"\n',
        encoding="utf-8",
    )
    wanted = [
        f"? omit: {HANDSHAKE_LINE}\n",
        f"? omit: {LEGACY_LINE}\n",
        "! omit: refused push/event (-32002): Capability denied: pushEvents is not in the uses "
        "of feature set omit.chat\n",
        f"? omit: {REFUSAL_LINE}\n",
        "omit omit:#general | Ada → Hi Uma",
    ]
    out, err = await run_until(["run", str(path), "--duration", "120"], wanted, tmp_path)
    assert "Traceback" not in err
    lines = unstamped(out)
    assert sum(line == f"? omit: {REFUSAL_LINE}" for line in lines) == 1  # once, two refusals


def check_connect(tmp_path: Path, server_keys: str = "") -> list[str]:
    """``mcplive check --connect`` on a config with the omitted-use server (and ``server_keys``
    added to its entry); the lines it printed, once it exited 0."""
    (tmp_path / "quiet.toml").write_text("", encoding="utf-8")
    path = tmp_path / "omit.toml"
    path.write_text(
        '[[servers]]\nid = "omit"\ncommand = ["python", "-m", "tests.omitted_use_server"]\n'
        f'env = {{ PYTHONPATH = "{ROOT}" }}\n{server_keys}\n'
        '[[agents]]\nname = "Ada"\nmodel = "scripted:quiet.toml"\n',
        encoding="utf-8",
    )
    result = subprocess.run(
        [*MCPLIVE, "check", "--connect", str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
        env=child_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


def test_check_connect_names_the_set_and_the_missing_use(tmp_path: Path) -> None:
    lines = check_connect(tmp_path)
    at = lines.index("  server omit (live):")
    under = lines[at + 1 :]
    assert (
        "    feature set omit.chat: enabled, but its uses lack pushEvents: push/event naming it "
        "is refused"
    ) in under
    assert "    feature set omit.chat: enabled" not in under  # never as if it could push
    assert "    feature set omit.legacy: invalid_uses" in under
    assert f"    declaration mismatch: {HANDSHAKE_LINE}" in under
    assert f"    declaration mismatch: {LEGACY_LINE}" in under


def update_received(e: dict[str, Any]) -> bool:
    return e["event"] == "received" and e["message"].get("method") == "featureSets/update"


async def test_a_manifest_change_sends_only_the_sets_the_host_enables(tmp_path: Path) -> None:
    changed = {
        "version": "0.5",
        "pushEvents": True,
        "channels": {"register": True, "publish": True, "incoming": True, "lifecycle": True},
        "featureSets": {
            "lobby.chat": {"uses": ["channels.register", "channels.incoming"]},
            "lobby.events": {"uses": ["pushEvents"]},
            "lobby.old": {"uses": ["pushEvents", "contextHooks.beforeInference"]},
        },
    }
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lob:
            mark = lob.ctl.mark()
            lob.ctl.send({"cmd": "manifest", "manifest": changed})
            update = await lob.ctl.wait_for(update_received, "the update", since=mark)
    assert update["message"]["params"]["enabled"] == ["lobby.chat", "lobby.events"]


async def test_a_reload_sends_only_the_sets_the_host_enables(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lob:
            running = lob.host.config
            lobby = attrs.evolve(running.servers[0], disabled_capabilities=("pushEvents",))
            mark = lob.ctl.mark()
            await lob.host.reload(attrs.evolve(running, servers=(lobby,)))
            update = await lob.ctl.wait_for(update_received, "the update", since=mark)
            # lobby.events needs pushEvents, which the operator no longer grants
            assert update["message"]["params"]["enabled"] == ["lobby.chat"]
            mark = lob.ctl.mark()
            back = await lob.host.reload(running)
            assert "pushEvents" in back["grants"]["lobby"]
            update = await lob.ctl.wait_for(update_received, "the next update", since=mark)
            assert update["message"]["params"]["enabled"] == ["lobby.chat", "lobby.events"]


async def test_an_operator_lets_a_forgotten_use_through_with_allow_unlisted_uses(
    tmp_path: Path,
) -> None:
    # heartbeat-mcpl's shape: pushEvents advertised and used, but listed in no set's uses
    record = tmp_path / "omit.jsonl"
    server = {**omitted(record), "allow_unlisted_uses": ["pushEvents"]}
    cfg = config(tmp_path, [server], [{"name": "Ada", "model": scripted(tmp_path, "a", GREETER)}])
    seen: list[Any] = []
    with trio.fail_after(90):
        async with Host.open(cfg) as host:
            stream = host.trace()
            await wait_trace(stream, lambda e: e.kind == "published", "Ada's reply", seen)
            await host.run_until_idle()
            pushed = [m for m in host.history("Ada") if m["metadata"].get("event_id")]
    ready = next(e for e in seen if e.kind == "ready")
    assert format_event(ready) == (
        "· omit ready: MCPL; no tools; pushEvents allowed outside its feature sets "
        "(allow_unlisted_uses)"
    )
    mismatches = [e.data for e in seen if e.kind == "declaration-mismatch"]
    assert [m["problem"] for m in mismatches] == ["unknown-capability"]  # no unlisted-use line
    assert not [e for e in seen if e.kind == "refused"]
    pushes = [e["reply"] for e in recorded(record) if e.get("answer") == "push/event"]
    assert [p.get("result") for p in pushes] == [{"accepted": True}] * 2
    assert sorted(m["metadata"]["event_id"] for m in pushed) == ["e1", "e2"]


def test_allow_unlisted_uses_names_only_capabilities_a_feature_set_can_use(
    tmp_path: Path,
) -> None:
    server = {**omitted(), "allow_unlisted_uses": ["pushEvents", "tools"]}
    cfg = config(tmp_path, [server], [{"name": "Ada", "model": scripted(tmp_path, "a", "")}])
    with pytest.raises(ConfigError, match="allow_unlisted_uses: 'tools' is not a capability"):
        load_config(cfg)


def test_check_connect_states_what_is_allowed_outside_the_sets(tmp_path: Path) -> None:
    under = check_connect(tmp_path, 'allow_unlisted_uses = ["pushEvents"]\n')
    assert "    used outside its feature sets (allow_unlisted_uses): pushEvents" in under
    assert "    feature set omit.chat: enabled" in under  # its pushes are no longer refused
    assert not any("uses lack pushEvents" in line for line in under)
