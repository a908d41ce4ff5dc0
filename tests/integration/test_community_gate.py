"""The community gate preset against a chat server that tags nothing: a mention, a reply and a
direct message each wake only the agent they concern; plain chatter wakes nobody, yet is in the
context of the next turn.

Two agents with ``gate = "community"`` on a recording model that answers every turn. Real
websocket servers in this process, the real clock with a deadline; the host is let settle
(``run_until_idle``) between steps, and the assertions count model calls, never time.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from actors import Host
from tests.chat_servers import DiscordServer
from tests.helpers import RecordingModel, install

pytestmark = pytest.mark.slow

BOB = {"id": "7", "name": "bob"}


def calls(model: RecordingModel) -> dict[str, int]:
    return {name: len(model.calls(name)) for name in ("Ada", "Grace")}


async def test_what_concerns_an_agent_wakes_it_and_chatter_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = RecordingModel(say="noted")
    install(monkeypatch, model)
    guild = DiscordServer()
    # a second account of Ada's alone, where alice writes to her directly
    private = DiscordServer("private")
    (tmp_path / "unused").write_text("", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    general = DiscordServer.GENERAL_1
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(guild.serve)
            await nursery.start(private.serve)
            cfg = {
                "host": {"data_dir": str(tmp_path / "data")},
                "servers": [guild.server_config(), private.server_config()],
                "agents": [
                    {"name": "Ada", "model": "scripted:unused", "gate": "community"},
                    {
                        "name": "Grace",
                        "model": "scripted:unused",
                        "gate": "community",
                        "aliases": ["Hopper"],
                        "servers": ["discord"],
                    },
                ],
            }
            async with Host.open(cfg) as host:
                await guild.ready.wait()
                await private.ready.wait()

                # a mention wakes only the agent named (as a whole word, any case, with @)
                await guild.say(general, "m1", "@ada are you around?", author=BOB)
                await host.run_until_idle()
                assert calls(model) == {"Ada": 1, "Grace": 0}

                # a reply to Ada's answer (the first publish) wakes only her
                ada_post = "discord-pub-1"
                assert len(guild.published()) == 1
                await guild.say(general, "m2", "good to hear", author=BOB, reply_to=ada_post)
                await host.run_until_idle()
                assert calls(model) == {"Ada": 2, "Grace": 0}

                # a direct message wakes the agent it is written to, with no name in it
                await private.say(DiscordServer.DM, "d1", "a question for you")
                await host.run_until_idle()
                assert calls(model) == {"Ada": 3, "Grace": 0}

                # chatter (a name inside another word is no mention) wakes nobody
                await guild.say(general, "m3", "Adam says the graceful lamp is on", author=BOB)
                await host.run_until_idle()
                assert calls(model) == {"Ada": 3, "Grace": 0}

                # an alias wakes Grace, whose turn reads the chatter before it
                await guild.say(general, "m4", "Hopper, what did you make of it?", author=BOB)
                await host.run_until_idle()
                assert calls(model) == {"Ada": 3, "Grace": 1}
                context = str(model.calls("Grace")[0].messages)
                assert "the graceful lamp is on" in context
                assert "what did you make of it?" in context
            nursery.cancel_scope.cancel()
