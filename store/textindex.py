"""The text index: an SQLite FTS5 table over each stored item's body text, for substring search.

``item_text`` (schema version 4) holds, for each item (rowid = the item's number), the text that
search matches (:func:`~store.bodytext.body_text`: the text blocks without the stored source
header) case-folded the way :func:`~store.bodytext.text_matcher` folds it (``str.casefold``). Its
``trigram`` tokenizer (case-sensitive: the text is folded already) indexes every run of three
characters, so a phrase query of the folded needle finds exactly the items whose folded text
holds it: the same messages a scan with ``text_matcher`` finds. The table is contentless (the
text itself is not kept, only the index).

A needle of fewer than :data:`MIN_INDEXED` characters once folded cannot be looked up in a
trigram index; such a needle (and one holding a lone surrogate, a NUL, or a character SQLite
reads as U+FFFD) is matched by scanning (:func:`scan_needle` says which).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from store.bodytext import SOURCE_HEADER_KEY, body_text
from store.codec import to_plain

#: The index: contentless, trigram, no per-row sizes (nothing ranks the results).
TEXT_INDEX_SCHEMA = (
    "CREATE VIRTUAL TABLE item_text USING fts5("
    "text, content='', columnsize=0, tokenize='trigram case_sensitive 1')",
)
#: What the index holds in place of a NUL (FTS5 would stop reading the text there); a needle
#: holding it (or a NUL) is scanned for.
NUL_STAND_IN = "\uffff"
#: Characters the index cannot tell apart: SQLite reads U+FFFE and U+FFFF (so the NUL stand-in
#: too) as U+FFFD. A needle holding any of them, or a NUL, is scanned for.
UNINDEXABLE = frozenset({"\x00", "\ufffd", "\ufffe", NUL_STAND_IN})
#: The shortest folded needle the index can look up (the tokenizer's token length).
MIN_INDEXED = 3


def index_text(blocks: Sequence[Mapping[str, Any]], metadata: Mapping[str, Any]) -> str:
    """What the index holds for a body: its search text as the store keeps it (a lone surrogate
    is stored as U+FFFD), case-folded."""
    text = body_text({"blocks": blocks, "metadata": metadata})
    header = metadata.get(SOURCE_HEADER_KEY)
    if not encodable(text) or (isinstance(header, str) and not encodable(header)):
        # read it as it is stored: every string with U+FFFD for a lone surrogate
        text = body_text(to_plain({"blocks": blocks, "metadata": metadata}, well_formed=True))
    # FTS5 reads text up to a NUL: the index holds another character in its place.
    return text.casefold().replace("\x00", NUL_STAND_IN)


def needle_query(needle: str) -> str | None:
    """The FTS5 query finding the items whose text holds ``needle`` (case-insensitive), or None
    when the index cannot answer for it and the text must be scanned."""
    folded = needle.casefold()
    if len(folded) < MIN_INDEXED or not encodable(folded):
        return None
    if not UNINDEXABLE.isdisjoint(folded):
        return None
    return '"' + folded.replace('"', '""') + '"'  # one phrase: no operator is read in it


def encodable(text: str) -> bool:
    """Whether ``text`` can be stored as UTF-8 (it holds no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
