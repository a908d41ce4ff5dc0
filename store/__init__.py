"""Persistence: the embedded SQLite + CBOR store.

Writes go through one :class:`GroupCommitWriter` thread (group commit, durable when acknowledged);
reads use a :class:`Reader`. This package does not depend on any async framework: the host keeps
the writer's rules in a trio task of its own (``actors.store_writer``), on the same store process
(:mod:`store.writer_process`).
"""

from store.bodytext import body_text, text_matcher
from store.codec import decode_body, decode_value, encode_body, encode_value
from store.errors import (
    CorruptRecord,
    StaleFence,
    StoreClosed,
    StoreDamaged,
    StoreError,
    StoreFull,
)
from store.facts import HEADER_FACT, NOTICE_FACT, NOTICE_KIND, facts_of
from store.reader import AuditEntry, Reader, SkippedRecord, StoredRow, UsageTotal
from store.records import (
    ROLES,
    Append,
    AppendResult,
    Fence,
    JournalEntry,
    MessageRecord,
    Op,
    OpResult,
    Outcome,
    PutState,
    RecordAudit,
    RecordUsage,
    TrimJournal,
)
from store.schema import SCHEMA_VERSION
from store.sqlite import (
    DB_FILENAME,
    Database,
    connect,
    connect_read_only,
    db_path,
)
from store.writer import Done, GroupCommitWriter, WriterStats

__all__ = [
    "DB_FILENAME",
    "HEADER_FACT",
    "NOTICE_FACT",
    "NOTICE_KIND",
    "ROLES",
    "SCHEMA_VERSION",
    "Append",
    "AppendResult",
    "AuditEntry",
    "CorruptRecord",
    "Database",
    "Done",
    "Fence",
    "GroupCommitWriter",
    "JournalEntry",
    "MessageRecord",
    "Op",
    "OpResult",
    "Outcome",
    "PutState",
    "Reader",
    "RecordAudit",
    "RecordUsage",
    "SkippedRecord",
    "StaleFence",
    "StoreClosed",
    "StoreDamaged",
    "StoreError",
    "StoreFull",
    "StoredRow",
    "TrimJournal",
    "UsageTotal",
    "WriterStats",
    "body_text",
    "connect",
    "connect_read_only",
    "db_path",
    "decode_body",
    "decode_value",
    "encode_body",
    "encode_value",
    "facts_of",
    "text_matcher",
]
