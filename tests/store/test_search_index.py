"""Substring search through the text index finds exactly the messages a scan with
``text_matcher`` over ``body_text`` finds (case, non-ASCII, quotes, FTS operators, short
needles); a regular expression still scans; ``Reader.rows(contains=...)`` filters the same way."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import store.reader
from store import Append, Database, MessageRecord, Reader, body_text, text_matcher
from tests.store.conftest import record, run_sql

_PIECES = [
    "a", "B", "z", "é", "É", "ß", "ẞ", "ss", "SS", "ς", "σ", "Σ", "İ", "i̇", "ﬁ", "fi", "中文",
    "🦜", " ", "\n", '"', "*", "AND", "and", "NEAR(", ")", "OR", "NOT", "^", ":", "-", "\x00",
    "\ufffd", "\uffff", "[source: s · #c]",
]  # fmt: skip
_texts = st.lists(st.sampled_from(_PIECES), max_size=8).map("".join)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[tuple[dict[str, Any], ...], dict[str, Any]]:
    """Blocks and metadata: some text blocks (and not text), with a source header or not."""
    blocks: list[dict[str, Any]] = [
        {"type": "text", "text": t} for t in draw(st.lists(_texts, min_size=1, max_size=3))
    ]
    if draw(st.booleans()):
        blocks.append({"type": "image", "data": draw(_texts), "mimeType": "image/png"})
    metadata: dict[str, Any] = {}
    if draw(st.booleans()):
        header = draw(st.sampled_from(["[source: s · #c]", "AND", "é"]))
        metadata["source_header"] = header
        if draw(st.booleans()):
            blocks.insert(0, {"type": "text", "text": header})
        else:
            blocks[0] = {"type": "text", "text": header + blocks[0]["text"]}
    return tuple(blocks), metadata


def _needles(texts: list[str]) -> st.SearchStrategy[str]:
    cuts = [
        st.sampled_from(texts).flatmap(
            lambda t: st.tuples(st.integers(0, len(t)), st.integers(0, 6)).map(
                lambda ij: t[ij[0] : ij[0] + ij[1]]
            )
        )
    ]
    changed = cuts[0].flatmap(lambda n: st.sampled_from([n, n.upper(), n.lower(), n.swapcase()]))
    return st.one_of(_texts, changed, st.sampled_from(['"', '""', "*", "AND", "NEAR(", "ab"]))


_example = itertools.count()


# One store for every example (a database per example would cost more than the example): each
# example adds its messages, and the search runs over all of them.
@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_index_search_finds_what_a_scan_finds(path: Path, data: st.DataObject) -> None:
    items = data.draw(st.lists(bodies(), min_size=1, max_size=8))
    records = []
    for i, (blocks, metadata) in enumerate(items):
        n = next(_example)
        for agent in ("ada", "bo")[: 1 + i % 2]:  # some items have two copies
            records.append(
                MessageRecord(
                    id=f"{agent}-{n}",
                    agent=agent,
                    role="user",
                    blocks=blocks,
                    metadata=metadata,
                    created_at=1.0,
                )
            )
    with Database(path) as db:
        db.apply([Append(records=tuple(records))])
    with Reader(path) as reader:
        stored = reader.history()
        own = {r.id for r in records}  # the needles come from this example's texts
        texts = [body_text(m) for m in stored if m["id"] in own]
        for _ in range(6):
            needle = data.draw(_needles(texts))
            matches = text_matcher(needle)
            scanned = [m["id"] for m in stored if matches(body_text(m))]
            assert [m["id"] for m in reader.search(needle)] == scanned, needle
            rows = reader.rows(contains=needle, limit=len(stored) + 1)
            assert [r.message["id"] for r in rows] == scanned, needle
            only_bo = [i for i in scanned if i.startswith("bo-")]
            assert [m["id"] for m in reader.search(needle, agent="bo")] == only_bo


def _stored(path: Path, texts: list[str]) -> list[str]:
    records = [record(t, header="[source: lobby · #general]") for t in texts]
    with Database(path) as db:
        db.apply([Append(records=(r,)) for r in records])
    return [r.id for r in records]


class _Scans:
    """Counts the bodies the scan function reads."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bodies = 0
        holds = store.reader._body_holds

        def counting(body: object, needle: object) -> bool:
            self.bodies += 1
            return holds(body, needle)

        monkeypatch.setattr(store.reader, "_body_holds", counting)


def test_a_needle_of_three_characters_or_more_reads_no_body_to_match(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _stored(path, ["Good morning", "good night", "lobby news", "Morning!"])
    scans = _Scans(monkeypatch)
    with Reader(path) as reader:
        assert [m["id"] for m in reader.search("MORNING")] == [ids[0], ids[3]]
        assert [m["id"] for m in reader.search("good", limit=1)] == [ids[1]]
        assert reader.search("lobby ·") == []  # the header is not searched
        assert [r.message["id"] for r in reader.rows(contains="night")] == [ids[1]]
        assert scans.bodies == 0
        # shorter than a trigram: SQLite scans (every body read once), same semantics;
        # PostgreSQL's LIKE reads the index's text for any needle
        assert [m["id"] for m in reader.search("NI")] == [ids[0], ids[1], ids[3]]
        assert scans.bodies == (0 if reader.dialect == "postgresql" else 4)
        assert [m["id"] for m in reader.search("")] == ids


def test_a_lone_surrogate_needle_matches_nothing(path: Path) -> None:
    _stored(path, ["bad \ud800 text", "plain"])
    with Reader(path) as reader:
        assert reader.search("\ud800") == []
        assert reader.rows(contains="x\ud800y") == []
        assert [m["blocks"][1]["text"] for m in reader.search("bad \ufffd")] == ["bad \ufffd text"]


@pytest.mark.parametrize("stand_in", ["\ufffd", "\ufffe", "\uffff"])
def test_a_needle_sqlite_reads_as_the_nul_stand_in_finds_only_what_it_holds(
    path: Path, stand_in: str
) -> None:
    # SQLite reads U+FFFE and U+FFFF as U+FFFD, so the index holds a NUL and these alike
    ids = _stored(path, ["a\x00ß", f"a{stand_in}ß"])
    with Reader(path) as reader:
        assert [m["id"] for m in reader.search(f"a{stand_in}ß")] == [ids[1]]
        assert [m["id"] for m in reader.search(f"{stand_in}SS")] == [ids[1]]
        assert [m["id"] for m in reader.search("a\x00ß")] == [ids[0]]


def test_a_regex_search_streams_and_keeps_only_the_newest_matches(path: Path) -> None:
    ids = _stored(path, [f"item {n}" for n in range(50)])
    with Reader(path) as reader:
        assert [m["id"] for m in reader.search(r"^item \d$", regex=True)] == ids[:10]
        assert [m["id"] for m in reader.search(r"item [1-4]5", regex=True, limit=2)] == [
            ids[35],
            ids[45],
        ]


def test_an_index_row_updated_behind_the_store_is_still_read_from_the_body(path: Path) -> None:
    ids = _stored(path, ["alpha", "beta"])
    run_sql(
        path,
        "UPDATE items SET body = ? WHERE num IN (SELECT item FROM message_refs WHERE id = ?)",
        (b"\xff\x00", ids[0]),
    )
    with Reader(path) as reader:
        assert reader.search("alpha") == []  # it no longer decodes: skipped, and said so
        assert [s.key for s in reader.take_skipped()] == [ids[0]]


@pytest.mark.parametrize("regex", [False, True])
def test_matches_passed_over_do_not_count_towards_the_limit(path: Path, regex: bool) -> None:
    ids = _stored(
        path, ["the codeword is here"] + [f"quote {n}: the codeword is" for n in range(30)]
    )

    def keep(m: dict[str, Any]) -> bool:
        return "quote" not in body_text(m)

    with Reader(path) as reader:
        found = reader.search("codeword is", regex=regex, limit=2, keep=keep)
        assert [m["id"] for m in found] == [ids[0]]
        newest = reader.search("codeword", regex=regex, limit=2)
        assert [m["id"] for m in newest] == ids[-2:]
