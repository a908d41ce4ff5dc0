"""A host whose ``[host] store`` is a PostgreSQL database: it stores, answers and reads back as
on the embedded store, keeps nothing of the store in its data dir, and a host started later on
the same database (its DSN from the variable ``store_env`` names) goes on with the history."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from actors.cli.status import summary
from actors.status import StatusWriter
from protocol import status as fmt
from store import Reader
from tests.cli_helpers import child_env, mcplive
from tests.helpers import (
    publish_received,
    publishes,
    running_lobby,
    send_incoming,
    texts,
    without_notices,
)

pytestmark = pytest.mark.slow

HEALTHY = fmt.Verdict(code=fmt.HEALTHY)

HELLO = """
[[rules]]
when = "(?i)\\\\bhello\\\\b"
say = "Hi there, hello to you!"
"""


async def test_a_host_on_postgresql_answers_and_a_later_host_goes_on_with_its_history(
    tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(60):
        async with running_lobby(
            tmp_path, {"Ada": HELLO, "Grace": ""}, host_keys={"store": pg_dsn}
        ) as lb:
            send_incoming(lb.ctl, "lobby:#random", "x1", "hello all")
            await lb.ctl.wait_for(publish_received(), "Ada's reply")
            await lb.host.run_until_idle()
            assert publishes(lb.ctl) == [("lobby:#random", "Hi there, hello to you!")]
            ada = without_notices(lb.host.history("Ada"))
            assert texts(ada, "user") == ["hello all"]
            assert texts(ada, "assistant") == ["Hi there, hello to you!"]
            # the status file (and ``mcplive status``) names the store, never a password
            doc = StatusWriter(lb.host.ctx).body()
            assert doc["store"] == pg_dsn  # the test cluster's DSN holds no password
            shown = summary(tmp_path, 1, {**doc, "written_at": doc["started_at"]}, HEALTHY, 0)
            assert f"store: {pg_dsn}" in shown
    assert not (tmp_path / "data" / "store.sqlite3").exists()
    with Reader(pg_dsn, read_only=True) as reader:
        assert texts(without_notices(reader.history("Ada")), "assistant") == [
            "Hi there, hello to you!"
        ]
        assert texts(reader.history("Grace"), "user") == ["hello all", "Hi there, hello to you!"]

    monkeypatch.setenv("MCPLIVE_TEST_STORE", pg_dsn)
    later = tmp_path / "later"
    later.mkdir()
    with trio.fail_after(60):
        async with running_lobby(
            later, {"Ada": HELLO, "Grace": ""}, host_keys={"store_env": "MCPLIVE_TEST_STORE"}
        ) as lb:
            send_incoming(lb.ctl, "lobby:#random", "x2", "hello again")
            await lb.ctl.wait_for(publish_received(), "Ada's second reply")
            await lb.host.run_until_idle()
            ada = without_notices(lb.host.history("Ada"))
            assert texts(ada, "user") == ["hello all", "hello again"]
            assert texts(ada, "assistant") == ["Hi there, hello to you!"] * 2


def test_history_and_usage_read_the_configured_database(tmp_path: Path, pg_dsn: str) -> None:
    """``mcplive history`` and ``usage`` given a config read its PostgreSQL store."""
    from store import Append, Database, MessageRecord, RecordUsage

    with Database(pg_dsn) as db:
        db.apply(
            [
                Append(
                    records=(
                        MessageRecord(
                            id="m1",
                            agent="Ada",
                            role="assistant",
                            blocks=({"type": "text", "text": "stored in postgres"},),
                            metadata={},
                            created_at=1_700_000_000.0,
                        ),
                    )
                ),
                RecordUsage(
                    at=1_700_000_000.0,
                    agent="Ada",
                    model="scripted:x",
                    turn=1,
                    turn_id="t1",
                    phase="completed",
                    calls=1,
                    input_tokens=7,
                ),
            ]
        )
    (tmp_path / "rules.toml").write_text("", encoding="utf-8")
    config = tmp_path / "host.toml"
    config.write_text(
        '[host]\ndata_dir = "data"\nstore_env = "MCPLIVE_TEST_STORE"\n'
        '[[agents]]\nname = "Ada"\nmodel = "scripted:rules.toml"\n',
        encoding="utf-8",
    )
    env = child_env(MCPLIVE_TEST_STORE=pg_dsn)
    history = mcplive("history", "--config", str(config), cwd=tmp_path, env=env)
    assert history.returncode == 0, history.stderr
    assert "stored in postgres" in history.stdout
    usage = mcplive("usage", str(config), "--json", cwd=tmp_path, env=env)
    assert usage.returncode == 0, usage.stderr
    assert '"input_tokens": 7' in usage.stdout
