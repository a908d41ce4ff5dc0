"""``mcplive history`` as an operator uses it: ids and times, the newest N, since when, one
channel, set-aside messages marked, and clear errors; ``--json`` stays one stored message per
line."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest
import trio

from actors import Host
from actors.agent.actor import live_messages
from store import Reader, db_path
from tests.cli_helpers import (
    child_env,
    make_store,
    mcplive,
    one_line,
    store_files,
    stored,
    tree_digest,
    unchanged_store,
)
from tests.store.old_schema import write_v3_store

pytestmark = pytest.mark.slow


def stamp(at: float) -> str:
    return dt.datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")


def history(data: Path, *args: str) -> list[str]:
    result = mcplive("history", "--data-dir", str(data), *args, cwd=data.parent)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout.splitlines()


def ids(lines: list[str]) -> list[str]:
    return [line.split(" ")[2] for line in lines]


G = "lobby:#general"
R = "lobby:#random"
#: lobby's #general as the lobby server registers it: its label is "general"
GENERAL = {"server": "lobby", "channel": G, "label": "general"}


@pytest.fixture
def chat(tmp_path: Path) -> Path:
    """A data dir: two agents hearing two channels of one server over three hours."""
    now = time.time()
    data = tmp_path / "data"
    make_store(
        data,
        [
            stored("m1", "good morning", at=now - 3 * 3600, **GENERAL),
            stored("m2", "good morning", at=now - 3 * 3600, agent="Grace", **GENERAL),
            stored("m3", "Morning!", at=now - 2 * 3600, role="assistant"),
            stored("m4", "anyone here?", at=now - 3600 + 60, server="lobby", channel=R),
            stored("m5", "a chat/with/slashes", at=now - 1800, server="chat", channel="chat:a/b"),
            stored("m6", "late news", at=now - 60, **GENERAL),
        ],
    )
    return data


def test_plain_lines_carry_time_and_id(chat: Path) -> None:
    with Reader(db_path(chat), read_only=True) as reader:
        rows = reader.rows()
    lines = history(chat)
    assert lines == [
        f"{stamp(rows[0].created_at)} m1 Ada user lobby lobby:#general: good morning",
        f"{stamp(rows[1].created_at)} m2 Grace user lobby lobby:#general: good morning",
        f"{stamp(rows[2].created_at)} m3 Ada assistant Morning!",
        f"{stamp(rows[3].created_at)} m4 Ada user lobby lobby:#random: anyone here?",
        f"{stamp(rows[4].created_at)} m5 Ada user chat chat:a/b: a chat/with/slashes",
        f"{stamp(rows[5].created_at)} m6 Ada user lobby lobby:#general: late news",
    ]


def test_limit_keeps_the_newest_n_oldest_first(chat: Path) -> None:
    assert ids(history(chat, "--limit", "2")) == ["m5", "m6"]
    assert ids(history(chat, "--limit", "2", "--agent", "Grace")) == ["m2"]
    assert ids(history(chat, "--limit", "2", "--search", "good")) == ["m1", "m2"]
    assert ids(history(chat, "--limit", "2", "--channel", "lobby:#general")) == ["m2", "m6"]
    assert ids(history(chat, "--limit", "99")) == ["m1", "m2", "m3", "m4", "m5", "m6"]
    assert history(chat, "--limit", "0") == []
    bad = mcplive("history", "--data-dir", str(chat), "--limit", "-1", cwd=chat.parent)
    assert bad.returncode == 2 and "--limit: -1 is negative" in bad.stderr


def test_since_takes_a_duration_or_an_iso_time(chat: Path) -> None:
    assert ids(history(chat, "--since", "1h")) == ["m4", "m5", "m6"]
    assert ids(history(chat, "--since", "45m")) == ["m5", "m6"]
    assert ids(history(chat, "--since", "1h30m", "--limit", "1")) == ["m6"]
    two_hours_ago = dt.datetime.now() - dt.timedelta(hours=2, minutes=30)
    assert ids(history(chat, "--since", two_hours_ago.isoformat(timespec="minutes"))) == [
        "m3", "m4", "m5", "m6",
    ]  # fmt: skip
    in_utc = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=45)).isoformat()
    assert ids(history(chat, "--since", in_utc)) == ["m5", "m6"]
    with Reader(db_path(chat), read_only=True) as reader:
        today = [
            r.message["id"]
            for r in reader.rows()
            if dt.date.fromtimestamp(r.created_at) == dt.date.today()
        ]
    assert ids(history(chat, "--since", dt.date.today().isoformat())) == today
    bad = mcplive("history", "--data-dir", str(chat), "--since", "last week", cwd=chat.parent)
    assert bad.returncode == 2
    assert one_line(bad).startswith("mcplive: --since: 'last week' is neither an ISO date/time")


def test_channel_takes_an_id_or_server_slash_id(chat: Path) -> None:
    assert ids(history(chat, "--channel", "lobby:#general")) == ["m1", "m2", "m6"]
    assert ids(history(chat, "--channel", "lobby/lobby:#random")) == ["m4"]
    assert ids(history(chat, "--channel", "chat:a/b")) == ["m5"]
    assert ids(history(chat, "--channel", "chat/chat:a/b")) == ["m5"]


def test_channel_takes_what_the_transcript_shows(chat: Path) -> None:
    """The transcript prints ``lobby lobby:#general``; its label is ``general``."""
    for name in ("#general", "general", "lobby/#general", "lobby/general", "lobby lobby:#general"):
        assert ids(history(chat, "--channel", name)) == ["m1", "m2", "m6"], name
    # without a label stored, the id without its server's prefix still names it
    assert ids(history(chat, "--channel", "#random")) == ["m4"]
    assert ids(history(chat, "--channel", "lobby/#random", "--limit", "1")) == ["m4"]


@pytest.mark.parametrize("name", ["#nowhere", "other/lobby:#general", "chat/#general", "lobby:"])
def test_an_unknown_channel_is_an_error_listing_the_known_ones(chat: Path, name: str) -> None:
    result = mcplive("history", "--data-dir", str(chat), "--channel", name, cwd=chat.parent)
    assert result.returncode == 2
    assert result.stdout == ""
    assert one_line(result) == (
        f"mcplive: --channel {name}: no messages stored from that channel in {db_path(chat)}; "
        "give a channel id, a label (#general) or SERVER/CHANNEL; channels with stored "
        "messages: lobby/lobby:#general (general), lobby/lobby:#random, chat/chat:a/b"
    )


def test_an_unknown_agent_is_an_error_listing_the_known_ones(chat: Path) -> None:
    result = mcplive("history", "--data-dir", str(chat), "--agent", "Bob", cwd=chat.parent)
    assert result.returncode == 2
    assert one_line(result) == (
        f"mcplive: --agent Bob: no messages stored for that agent in {db_path(chat)}; agents "
        "with stored messages: Ada, Grace"
    )


def utc(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def test_json_stays_one_stored_message_per_line_with_its_time(chat: Path) -> None:
    with Reader(db_path(chat), read_only=True) as reader:
        rows = reader.rows(agent="Ada")[-2:]
    lines = history(chat, "--json", "--agent", "Ada", "--limit", "2")
    assert [json.loads(line) for line in lines] == [
        {"ts": utc(row.created_at), **row.message} for row in rows
    ]


async def test_json_gives_every_line_a_time(tmp_path: Path) -> None:
    """What a host stores itself (its replies, tool calls and results, system notices) has its
    time in ``--json`` as much as what came in."""
    rules = tmp_path / "ada.toml"
    rules.write_text(
        '[[rules]]\nwhen = "(?i)hello"\nsay = "Hi!"\n'
        '[[rules]]\nwhen = "(?i)look"\ncalls = [{ tool = "nosuch", arguments = {} }]\n',
        encoding="utf-8",
    )
    data = tmp_path / "data"
    config = {
        "host": {"data_dir": str(data)},
        "agents": [{"name": "Ada", "model": f"scripted:{rules}"}],
    }
    with trio.fail_after(60):
        async with Host.open(config) as host:
            for text in ("hello", "look it up"):
                await host.post_local("Ada", text)
                await host.run_until_idle()
    lines = [json.loads(line) for line in await trio.to_thread.run_sync(history, data, "--json")]
    with Reader(db_path(data), read_only=True) as reader:
        rows = reader.rows(limit=len(lines) + 1)
    assert {line["role"] for line in lines} >= {"user", "assistant", "system"}
    assert [line["ts"] for line in lines] == [utc(row.created_at) for row in rows]


async def test_set_aside_messages_are_marked(tmp_path: Path) -> None:
    rules = tmp_path / "ada.toml"
    rules.write_text('[[rules]]\nwhen = "(?i)hello"\nsay = "Hi!"\n', encoding="utf-8")
    data = tmp_path / "data"
    config = {
        "host": {"data_dir": str(data)},
        "agents": [{"name": "Ada", "model": f"scripted:{rules}"}],
    }
    with trio.fail_after(60):
        async with Host.open(config) as host:
            for text in ("hello one", "hello two"):
                await host.post_local("Ada", text)
                await host.run_until_idle()
            first_reply = next(m for m in host.history("Ada") if m["role"] == "assistant")
            await host.rollback("Ada", first_reply["id"])
            await host.post_local("Ada", "hello three")
            await host.run_until_idle()
            messages = host.history("Ada")
    live = {m["id"] for m in live_messages(messages)}
    set_aside = [
        m["id"] for m in messages if m["id"] not in live and m["metadata"].get("kind") != "rollback"
    ]
    order = [m["id"] for m in messages]
    marker = next(m["id"] for m in messages if m["metadata"].get("kind") == "rollback")
    # everything after the reply up to the rollback: "hello two", its reply, their receipts
    assert set_aside == order[order.index(first_reply["id"]) + 1 : order.index(marker)]
    lines = await trio.to_thread.run_sync(history, data)
    marked = [line.split(" ")[2] for line in lines if " (set aside) " in line]
    assert marked == set_aside
    assert any("context rolled back to" in line for line in lines)  # the rollback itself
    # marked also when the rollback is not among the lines printed
    found = await trio.to_thread.run_sync(history, data, "--search", "hello two")
    assert len(found) == 1 and " (set aside) " in found[0]
    newest = await trio.to_thread.run_sync(history, data, "--limit", "2")
    assert all(" (set aside) " not in line for line in newest)


def test_search_is_case_insensitive_and_combines_with_the_other_filters(chat: Path) -> None:
    assert ids(history(chat, "--search", "MORNING")) == ["m1", "m2", "m3"]
    assert ids(history(chat, "--search", "morning", "--agent", "Grace")) == ["m2"]
    assert ids(history(chat, "--search", "morning", "--channel", G, "--limit", "1")) == ["m2"]
    assert ids(history(chat, "--search", "mo")) == ["m1", "m2", "m3"]  # too short to index
    assert ids(history(chat, "--search", '"*" AND')) == []  # operators are text here
    assert ids(history(chat, "--search", "morning", "--regex")) == ["m1", "m2"]


def test_a_search_text_may_start_with_a_dash(tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_store(data, [stored("s1", "use the -sign flag"), stored("s2", "sign here")])
    assert ids(history(data, "--search", "-sign")) == ["s1"]
    assert ids(history(data, "--search", "-sign", "--regex")) == ["s1"]
    assert ids(history(data, "--search=-sign", "--limit", "1")) == ["s1"]


def test_history_reads_a_version_3_store_as_it_is(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_v3_store(
        db_path(data),
        [[stored("m1", "good morning", server="lobby", channel=G)], [stored("m2", "Morning!")]],
    )
    before = tree_digest(data, skip=lambda p: not store_files(p))
    assert ids(history(data)) == ["m1", "m2"]
    assert ids(history(data, "--search", "MORNING", "--limit", "1")) == ["m2"]
    assert ids(history(data, "--search", "good m", "--channel", G)) == ["m1"]
    # a time for every line: every version of the store keeps each message's
    lines = [json.loads(line) for line in history(data, "--json")]
    assert [line["ts"] for line in lines] == [utc(1_800_000_000.0)] * 2
    unchanged_store(before, tree_digest(data, skip=lambda p: not store_files(p)))


def test_configured_credentials_never_print(tmp_path: Path) -> None:
    """A server may echo a secret it was given into a message; the store keeps what was sent,
    but ``history`` (plain and ``--json``) shows every configured credential as «redacted»: a
    server's token named by ``--config`` and a model API key from the environment."""
    token, key = "srv-token-0123456789", "sk-ant-secret-98765"
    data = tmp_path / "data"
    make_store(
        data,
        [
            stored("m1", f"my token is {token}", server="lobby", channel=G),
            stored("m2", f"and the key {key}", role="assistant"),
        ],
    )
    cfg = tmp_path / "host.toml"
    cfg.write_text(
        f'[host]\ndata_dir = "{data}"\n'
        f'[[servers]]\nid = "lobby"\nurl = "ws://127.0.0.1:9/"\ntoken = "{token}"\n'
        '[[agents]]\nname = "Ada"\nmodel = "scripted:rules.toml"\n'
    )
    (tmp_path / "rules.toml").write_text("")
    env = {**child_env(), "ANTHROPIC_API_KEY": key}
    for extra in ((), ("--json",)):
        out = mcplive("history", "--config", str(cfg), *extra, cwd=tmp_path, env=env)
        assert out.returncode == 0, out.stderr
        assert token not in out.stdout and key not in out.stdout
        assert out.stdout.count("«redacted»") == 2
        assert len(out.stdout.splitlines()) == 2  # still every message, one line each
    # without --config the environment's model key is still hidden; the token is not known
    plain = mcplive("history", "--data-dir", str(data), cwd=tmp_path, env=env)
    assert key not in plain.stdout and token in plain.stdout
    with Reader(db_path(data), read_only=True) as reader:
        kept = [row.message["blocks"][-1]["text"] for row in reader.rows()]
    assert any(token in text for text in kept)  # the store itself keeps what was sent


def test_a_bad_config_is_one_line_per_problem(tmp_path: Path) -> None:
    cfg = tmp_path / "host.toml"
    cfg.write_text("[host]\nbogus = 1\n")
    out = mcplive("history", "--config", str(cfg), cwd=tmp_path)
    assert out.returncode == 2
    assert out.stdout == ""
    assert all(line.startswith("mcplive: ") for line in out.stderr.splitlines())
    assert "bogus" in out.stderr
