"""Renderings shared between agents: the copies of one item are rendered once, and every
reader gets what rendering its own copy would give."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from actors.agent.history import render_for_model
from actors.renders import SharedRenders

SOURCE = {"inbound_source": {"server": "s", "channel": "c", "label": "#c"}, "author": {"name": "a"}}


def item(text: str, role: str = "user") -> dict[str, Any]:
    return {
        "role": role,
        "blocks": [{"type": "text", "text": text}],
        "metadata": copy.deepcopy(SOURCE),
    }


#: Which of five items (or rows) each step reads, for which agent, and whether from objects of
#: its own (decoded or encoded alone) instead of the shared ones.
PICKS = st.lists(
    st.tuples(st.integers(0, 4), st.sampled_from(["Ada", "Bo"]), st.booleans()), max_size=40
)


def copy_for(agent: str, of: Mapping[str, Any]) -> dict[str, Any]:
    """Another agent's copy of a stored item: its own message, the item's objects."""
    return {
        "id": f"{agent}-{id(of)}",
        "agent": agent,
        **{k: of[k] for k in ("role", "blocks", "metadata")},
    }


@given(picks=PICKS, cap=st.integers(1, 6))
def test_a_shared_rendering_is_what_rendering_the_copy_gives(
    picks: list[tuple[int, str, bool]], cap: int
) -> None:
    items = [item(f"text {i}", "user" if i % 2 else "assistant") for i in range(5)]
    renders = SharedRenders(cap)
    made: list[int] = []

    def make(m: Mapping[str, Any]) -> dict[str, Any]:
        made.append(1)
        return render_for_model(m)

    for index, agent, decoded_alone in picks:
        source = copy.deepcopy(items[index]) if decoded_alone else items[index]
        message = copy_for(agent, source)
        out = renders.render(message, make)
        assert out == render_for_model(message)
        out["tokens"] = 1  # a reader's own copy: changing it changes nobody else's
        assert "tokens" not in renders.render(message, make)
        assert len(renders) <= cap


def test_the_copies_of_one_item_are_rendered_once() -> None:
    renders = SharedRenders()
    shared = item("hello")
    made: list[Mapping[str, Any]] = []

    def make(m: Mapping[str, Any]) -> dict[str, Any]:
        made.append(m)
        return render_for_model(m)

    for agent in ["Ada", "Bo", "Cy"]:
        renders.render(copy_for(agent, shared), make)
    assert len(made) == 1
    renders.render(copy_for("Ada", item("hello")), make)  # equal, but decoded on its own
    assert len(made) == 2


def test_at_the_cap_the_oldest_rendering_goes() -> None:
    renders = SharedRenders(2)
    a, b, c = item("a"), item("b"), item("c")
    calls: list[str] = []

    def make(m: Mapping[str, Any]) -> dict[str, Any]:
        calls.append(m["blocks"][0]["text"])
        return render_for_model(m)

    for m in (a, b, c, b, a):
        renders.render(m, make)
    assert calls == ["a", "b", "c", "a"]
    assert len(renders) == 2


# -- rows of recent commits ------------------------------------------------------------------


def row_of(seq: int, agent: str, role: str, body: bytes) -> tuple[int, str, str, str, bytes]:
    return (seq, f"m{seq}", agent, role, body)


@given(picks=PICKS, cap=st.integers(1, 6))
def test_a_rendered_row_is_what_rendering_its_message_gives(
    picks: list[tuple[int, str, bool]], cap: int
) -> None:
    bodies = [f"text {i}".encode() for i in range(5)]  # body 0 is not plain
    renders = SharedRenders(cap)
    decoded: list[bytes] = []

    def decode(row: tuple[int, str, str, str, bytes]) -> dict[str, Any]:
        decoded.append(row[4])
        return {**item(row[4].decode(), row[3]), "id": row[1], "agent": row[2]}

    def plain(m: Mapping[str, Any]) -> bool:
        return m["blocks"][0]["text"] != "text 0"

    for seq, (index, agent, encoded_alone) in enumerate(picks):
        body = bytes(bytearray(bodies[index])) if encoded_alone else bodies[index]
        row = row_of(seq, agent, "user", body)
        out = renders.render_row(row, decode, plain, render_for_model)
        if index == 0:
            assert out is None
            continue
        assert out == {**render_for_model(decode(row)), "id": f"m{seq}"}
        assert len(renders) <= cap


def test_the_copies_of_one_row_are_decoded_and_rendered_once() -> None:
    renders = SharedRenders()
    body = b"hello"
    decoded: list[str] = []
    made: list[str] = []

    def decode(row: tuple[int, str, str, str, bytes]) -> dict[str, Any]:
        decoded.append(row[2])
        return {**item(row[4].decode()), "id": row[1], "agent": row[2]}

    def make(m: Mapping[str, Any]) -> dict[str, Any]:
        made.append(m["agent"])
        return render_for_model(m)

    shown = [
        renders.render_row(row_of(n, agent, "user", body), decode, lambda _m: True, make)
        for n, agent in enumerate(["Ada", "Bo", "Cy"])
    ]
    assert decoded == made == ["Ada"]
    assert [s["id"] for s in shown if s is not None] == ["m0", "m1", "m2"]
    assert shown[1] is not shown[2] and shown[1] is not None and "agent" not in shown[1]
    renders.render_row(row_of(3, "Ada", "assistant", body), decode, lambda _m: True, make)
    assert made == ["Ada", "Ada"]  # another role is another message
