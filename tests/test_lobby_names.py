"""The example lobby posts what a host publishes under the agent that spoke.

``examples.lobby.server.publish_author`` turns a publish's ``conversationId`` into the author
of the post (the rule, by hypothesis), and a lobby subprocess driven over raw JSON-RPC logs and
echoes each post under that author, falling back to the host's account.
"""

from __future__ import annotations

import unicodedata
from typing import Any

import trio
from hypothesis import example, given
from hypothesis import strategies as st

from examples.lobby.server import HOST_AUTHOR, PEOPLE, publish_author
from tests.test_lobby_server import TIMEOUT, Lobby, answered_echo, complete, lobby_process, text

#: conversationId → the author its post is echoed under.
CASES: list[tuple[Any, dict[str, str]]] = [
    ("agent:Ada", {"id": "agent:Ada", "name": "Ada"}),
    ("agent:Grace Hopper", {"id": "agent:Grace Hopper", "name": "Grace Hopper"}),
    ("agent:ada", {"id": "agent:ada", "name": "ada"}),  # its own agent: ids are kept as sent
    ("c1", HOST_AUTHOR),  # not the agent form
    ("Agent:Ada", HOST_AUTHOR),
    ("agent:", HOST_AUTHOR),  # no name
    ("agent: Ada", HOST_AUTHOR),  # padded
    ("agent:Ada\n[x]", HOST_AUTHOR),  # a line break
    ("agent:Ad\u200ba", HOST_AUTHOR),  # an invisible character
    ("agent:" + "a" * 65, HOST_AUTHOR),  # too long
    ("agent:Alice", HOST_AUTHOR),  # a person's name, in any case or width
    ("agent:BOB", HOST_AUTHOR),
    ("agent:\uff21lice", HOST_AUTHOR),  # a fullwidth A
    ("agent:alice", HOST_AUTHOR),  # a person's id
    (None, HOST_AUTHOR),
    (7, HOST_AUTHOR),
]


def fold(value: str) -> str:
    return unicodedata.normalize("NFKC", value).casefold()


@given(st.one_of(st.none(), st.integers(), st.text(), st.text().map(lambda t: "agent:" + t)))
@example("agent:Ada")
@example("agent:ALICE")
def test_a_post_is_an_agents_or_the_hosts_never_a_persons(conversation_id: Any) -> None:
    author = publish_author(conversation_id)
    if author == HOST_AUTHOR:
        return
    # the agent's: one id per conversation, never a person's id or name
    assert author == {"id": conversation_id, "name": conversation_id.removeprefix("agent:")}
    assert author["id"].startswith("agent:") and author["name"]
    people = {fold(p[key]) for p in PEOPLE for key in ("id", "name")}
    assert fold(author["id"]) not in people and fold(author["name"]) not in people
    assert author["name"].isprintable() and author["name"] == author["name"].strip()


@given(st.text(min_size=1, max_size=64))
def test_a_plain_name_is_kept_as_it_is(name: str) -> None:
    plain = name.isprintable() and name == name.strip()
    people = {fold(p[key]) for p in PEOPLE for key in ("id", "name")}
    expected = {"id": f"agent:{name}", "name": name} if plain else HOST_AUTHOR
    if fold(name) in people:
        expected = HOST_AUTHOR
    assert publish_author(f"agent:{name}") == expected


def test_people_can_be_given() -> None:
    assert publish_author("agent:Ada", people=[{"id": "u1", "name": "ada"}]) == HOST_AUTHOR
    assert publish_author("agent:Alice", people=[]) == {"id": "agent:Alice", "name": "Alice"}


async def publish_and_echo(lobby: Lobby, conversation_id: Any) -> dict[str, Any]:
    """Publish a line under ``conversation_id`` (left out when None); the echo's message."""
    params: dict[str, Any] = {"channelId": "lobby:#general", "content": text("hello lobby")}
    if conversation_id is not None:
        params["conversationId"] = conversation_id
    reply = await lobby.request("channels/publish", params)
    return dict(await answered_echo(lobby, reply["result"]["messageId"]))


async def test_each_post_is_logged_and_echoed_under_its_agent() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none") as lobby:
            await lobby.handshake()
            authors = [(await publish_and_echo(lobby, cid))["author"] for cid, _ in CASES]
            assert authors == [author for _, author in CASES]
            await lobby.notify(
                "channels/outgoing/chunk",
                {
                    "inferenceId": "i1",
                    "conversationId": "agent:Ada",
                    "channelId": "lobby:#general",
                    "index": 0,
                    "delta": "hi",
                },
            )
            params = {**complete("i1", "lobby:#general", "hi"), "conversationId": "agent:Ada"}
            await lobby.notify("channels/outgoing/complete", params)
            assert await lobby.close_stdin_and_wait() == 0
            log = lobby.stderr_text()
            assert "[lobby] #general <- Ada: hello lobby" in log
            assert "[lobby] #general <- mcplive: hello lobby" in log
            assert "#general by Ada: streamed 'hi'" in log
            assert "ERROR" not in log
