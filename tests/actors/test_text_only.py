"""``actors.models.base.text_only``: what a model that reads text only is sent in place of
images."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from actors.models.base import text_only

TEXT = st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=10))
IMAGE = st.builds(
    lambda mime: {"type": "image", "data": "iVBORw0KGgo=", "mimeType": mime},
    st.sampled_from(["image/png", "image/jpeg", ""]),
)
LINK = st.just({"type": "image", "uri": "https://example.org/a.png"})  # no data: kept
RESULT = st.builds(
    lambda items: {"type": "tool_result", "tool_use_id": "t1", "content": items},
    st.lists(st.one_of(TEXT, IMAGE), max_size=3),
)
BLOCK = st.one_of(TEXT, IMAGE, LINK, RESULT)
MESSAGE = st.builds(
    lambda role, blocks: {"role": role, "blocks": blocks, "metadata": {}},
    st.sampled_from(["user", "assistant", "tool"]),
    st.lists(BLOCK, max_size=4),
)


def images_in(blocks: list[Any]) -> int:
    count = 0
    for b in blocks:
        if b.get("type") == "image" and b.get("data"):
            count += 1
        if b.get("type") == "tool_result":
            count += images_in(list(b["content"]))
    return count


@given(st.lists(MESSAGE, max_size=5))
def test_every_image_with_data_becomes_a_note_and_nothing_else_changes(
    messages: list[dict[str, Any]],
) -> None:
    out = text_only(messages)
    assert [m["role"] for m in out] == [m["role"] for m in messages]
    for before, after in zip(messages, out, strict=True):
        assert images_in(list(after["blocks"])) == 0
        if images_in(before["blocks"]) == 0:
            assert after is before  # untouched: the same object, so the same bytes each turn
            continue
        assert len(after["blocks"]) == len(before["blocks"])
        notes = [b for b in after["blocks"] if "reads text only" in str(b.get("text", ""))]
        inner = [
            i
            for b in after["blocks"]
            if b.get("type") == "tool_result"
            for i in b["content"]
            if "reads text only" in str(i.get("text", ""))
        ]
        assert len(notes) + len(inner) == images_in(before["blocks"])
        for old, new in zip(before["blocks"], after["blocks"], strict=True):
            if old.get("type") == "text" or (old.get("type") == "image" and not old.get("data")):
                assert new is old
    assert text_only(out) == out  # a second pass changes nothing
