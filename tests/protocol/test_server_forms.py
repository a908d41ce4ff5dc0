"""The params a server sends, built without I/O: what is given is carried, what is not is absent."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.server_forms import content_of, incoming_message, inference_params, push_params

TEXT = st.text(max_size=20)
TAGS = st.lists(st.sampled_from(["chat:mention", "chat:dm", "x:y", "x:z=1"]), max_size=6)
OPTIONAL = st.none() | st.dictionaries(st.sampled_from(["key", "initial"]), TEXT, min_size=1)


@given(text=TEXT, tags=TAGS, origin=OPTIONAL, coalesce=OPTIONAL)
def test_a_push_carries_what_it_was_given_and_nothing_else(
    text: str, tags: list[str], origin: dict[str, Any] | None, coalesce: dict[str, Any] | None
) -> None:
    params = push_params(
        text,
        feature_set="fs",
        event_id="e1",
        timestamp="t",
        tags=tags,
        origin=origin,
        coalesce=coalesce,
    )
    assert params["payload"] == {"content": [{"type": "text", "text": text}]}
    assert (params["featureSet"], params["eventId"], params["timestamp"]) == ("fs", "e1", "t")
    assert params.get("tags", []) == list(dict.fromkeys(tags))
    assert params.get("origin") == origin and params.get("coalesce") == coalesce
    assert set(params) <= {
        "featureSet",
        "eventId",
        "timestamp",
        "payload",
        "tags",
        "origin",
        "coalesce",
    }


@given(thread=st.none() | st.text(min_size=1, max_size=5), author=TEXT, tags=TAGS)
def test_an_incoming_message_names_its_place_only_when_given(
    thread: str | None, author: str, tags: list[str]
) -> None:
    msg = incoming_message(
        "hi",
        channel_id="c",
        message_id="m",
        author=author,
        timestamp="t",
        thread_id=thread,
        tags=tags,
    )
    assert ("threadId" in msg) == (thread is not None) and msg.get("threadId") == thread
    assert msg["author"] == {"id": author, "name": author}
    assert "eventId" not in msg and "coalesce" not in msg


def test_refusals_and_shapes() -> None:
    with pytest.raises(ValueError, match="needs an event id"):
        incoming_message(
            "x", channel_id="c", message_id="m", author="a", timestamp="t", coalesce={"key": "k"}
        )
    with pytest.raises(ValueError, match="non-empty"):
        incoming_message(
            "x", channel_id="c", message_id="m", author="a", timestamp="t", thread_id=""
        )
    with pytest.raises(ValueError, match="non-empty event id"):
        push_params("x", feature_set="f", event_id="", timestamp="t")
    with pytest.raises(ValueError, match="string 'type'"):
        content_of([{"text": "no type"}])
    assert inference_params("q", feature_set="f") == {
        "featureSet": "f",
        "messages": [{"role": "user", "content": "q"}],
    }
    assert inference_params("q", feature_set="f", stream=True, max_tokens=5)["preferences"] == {
        "maxTokens": 5
    }
