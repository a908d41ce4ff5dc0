"""Immutable records and write operations handled by the store.

A write is one *op*: :class:`Append` (messages and journal entries, optionally guarded by a dedupe
key), :class:`PutState` (small key-value state for host actors), :class:`TrimJournal`,
:class:`RecordUsage` (a row of the usage ledger) or :class:`RecordAudit` (a row of the audit
record of the operator's actions). Each op is applied atomically and yields one result:
:class:`AppendResult` for an append, ``None`` for a state write, a trim, a usage or an audit row,
or a :class:`~store.errors.StoreError` instance when that op alone failed.

The journal
    An append-only command log in named *streams* (for example the state of RFC-006 event
    coalescing, :mod:`protocol.coalesce`). An :class:`Append` carries the :class:`JournalEntry`
    values of one transition next to the messages that transition stores; both are committed in
    the same transaction, so after a crash an entry exists exactly when its messages do. The
    entries are written only when the append is applied: a dedupe hit skips its entries with its
    messages, so a retried transition is never journaled twice. An append may carry entries and
    no message (a transition that stores nothing). Each entry gets a ``seq`` that increases with
    every entry written and is never reused, even after a trim;
    :meth:`~store.reader.Reader.journal` reads a stream back oldest first, for replay.

    Bound: the journal grows by every journaled transition and the store removes no row on its
    own. A stream's writer compacts it by appending a snapshot record (one entry that replays to
    the whole state, :meth:`protocol.coalesce.Coalescer.snapshot`), reading back that entry's
    seq once the append is acknowledged (:meth:`~store.reader.Reader.last_seq`), and then
    applying ``TrimJournal(stream, before_seq=seq)``, which deletes every older row of that
    stream in one transaction. A crash between the two leaves the older rows in place, and
    replaying them before the snapshot gives the same state. The host's coalescer does this on
    a count of records (see :mod:`actors.coalescer`).

Fencing
    A write made for a lease (an agent's messages, its state, its usage) may carry that lease as
    a :class:`Fence`: the resource, the host that holds it, and the epoch it holds it under. On a
    PostgreSQL store the writer checks each distinct fence of a batch once, inside the batch's
    own transaction (:func:`store.leases.fenced_write`), before anything of the batch is written;
    an op whose fence is stale lands nothing and its outcome is :class:`~store.errors.StaleFence`,
    while the other ops of the batch land as they would have. On an SQLite store a fence is
    checked against nothing and passes: one host owns an SQLite store, and it leases nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeAlias

import attrs

from store.errors import StoreError

#: The roles a stored message may have.
ROLES = frozenset({"user", "assistant", "tool", "system"})


def _non_empty_str(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is str and value:
        return
    if not isinstance(value, str) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty string, got {value!r}")


def _finite_number(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is float and math.isfinite(value):
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{attribute.name} must be a finite number, got {value!r}")


def _is_mapping(value: object) -> bool:
    return type(value) is dict or isinstance(value, Mapping)  # dict first: the common, cheap case


def _mapping(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not _is_mapping(value):
        raise TypeError(f"{attribute.name} must be a mapping, got {type(value).__name__}")


#: The tuple of blocks last found valid. The copies of one item for every agent hearing it share
#: their blocks: a tuple (immutable, so still valid) is checked once, not once per copy.
_last_valid_blocks: list[object] = [None]


def _blocks(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is _last_valid_blocks[0]:
        return
    if not isinstance(value, tuple):
        raise TypeError(f"{attribute.name} must be a tuple, got {type(value).__name__}")
    for block in value:
        if not _is_mapping(block):
            raise TypeError(
                f"each of {attribute.name} must be a mapping, got {type(block).__name__}"
            )
    _last_valid_blocks[0] = value


def _role(_inst: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in ROLES:
        raise ValueError(f"role must be one of {sorted(ROLES)}, got {value!r}")


def _trusted(cls: type[Any], names: tuple[str, ...], values: tuple[Any, ...]) -> Any:
    """An instance of ``cls`` with ``values`` set, unchecked: how a record or op that was checked
    when it was made is unpickled (the store's writer process gets them over its own pipe)."""
    made = object.__new__(cls)
    for name, value in zip(names, values, strict=True):
        object.__setattr__(made, name, value)
    return made


@attrs.frozen(kw_only=True)
class MessageRecord:
    """One stored message (DESIGN section 5) as it is written."""

    id: str = attrs.field(validator=_non_empty_str)
    agent: str = attrs.field(validator=_non_empty_str)
    role: str = attrs.field(validator=_role)
    blocks: tuple[Mapping[str, Any], ...] = attrs.field(validator=_blocks)
    metadata: Mapping[str, Any] = attrs.field(validator=_mapping)
    created_at: float = attrs.field(validator=_finite_number)

    def for_agent(self, agent: str, id: str) -> MessageRecord:
        """The copy of this record for ``agent`` under ``id``: the same role, time, blocks and
        metadata objects (so the store keeps their body once). Only the new id and agent are
        checked: the rest was checked when this record was made."""
        _non_empty_str(self, _ID_FIELD, id)
        _non_empty_str(self, _AGENT_FIELD, agent)
        return _trusted_record(id, agent, self.role, self.blocks, self.metadata, self.created_at)

    def __reduce__(self) -> tuple[Any, ...]:
        return _trusted_record, (
            self.id,
            self.agent,
            self.role,
            self.blocks,
            self.metadata,
            self.created_at,
        )

    def as_message(self) -> dict[str, Any]:
        """The stored-message dict a reader would return for this record."""
        return {
            "id": self.id,
            "agent": self.agent,
            "role": self.role,
            "blocks": [dict(b) for b in self.blocks],
            "metadata": dict(self.metadata),
        }


_ID_FIELD, _AGENT_FIELD = attrs.fields(MessageRecord).id, attrs.fields(MessageRecord).agent


def _trusted_record(
    id: str,
    agent: str,
    role: str,
    blocks: tuple[Mapping[str, Any], ...],
    metadata: Mapping[str, Any],
    created_at: float,
) -> MessageRecord:
    """A record with these values, unchecked (:func:`_trusted` for the most common object of
    all, a copy per agent of every item): :meth:`MessageRecord.for_agent` checks only what it
    changes, and unpickling checks nothing."""
    made = object.__new__(MessageRecord)
    setter = object.__setattr__
    setter(made, "id", id)
    setter(made, "agent", agent)
    setter(made, "role", role)
    setter(made, "blocks", blocks)
    setter(made, "metadata", metadata)
    setter(made, "created_at", created_at)
    return made


def _dedupe_key(_inst: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if not (
        isinstance(value, tuple)
        and len(value) == 3
        and isinstance(value[0], str)
        and isinstance(value[1], str)
        and isinstance(value[2], str)
    ):
        raise ValueError(f"dedupe must be None or (kind, server_id, key) strings, got {value!r}")


def _journal_entries(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value == ():  # the common case, checked first: most appends journal nothing
        return
    if not isinstance(value, tuple) or not all(isinstance(e, JournalEntry) for e in value):
        raise TypeError(f"{attribute.name} must be a tuple of JournalEntry")


@attrs.frozen
class JournalEntry:
    """One journal record (any CBOR-encodable mapping) for the stream ``stream``."""

    stream: str = attrs.field(validator=_non_empty_str)
    record: Mapping[str, Any] = attrs.field(validator=_mapping)

    def __reduce__(self) -> tuple[Any, ...]:
        return _trusted, (JournalEntry, ("stream", "record"), (self.stream, self.record))


def _epoch(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be an int >= 1, got {value!r}")


@attrs.frozen
class Fence:
    """The lease a write is made for: ``holder`` (a host id) holds ``resource`` (``agent:Ada``)
    under ``epoch`` (:class:`store.leases.Held`). The write lands only while that is still so
    (see the module's docstring)."""

    resource: str = attrs.field(validator=_non_empty_str)
    holder: str = attrs.field(validator=_non_empty_str)
    epoch: int = attrs.field(validator=_epoch)

    def __reduce__(self) -> tuple[Any, ...]:
        return _trusted, (Fence, _FENCE_FIELDS, (self.resource, self.holder, self.epoch))


_FENCE_FIELDS = ("resource", "holder", "epoch")


def _fence(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, Fence):
        raise TypeError(f"{attribute.name} must be a Fence or None, got {type(value).__name__}")


@attrs.frozen(kw_only=True)
class Append:
    """Store ``records`` and then ``journal`` (in order) in one transaction.

    With ``dedupe = (kind, server_id, key)`` the key is recorded in the same transaction, and an
    op whose key is already present writes nothing, journal entries included (result
    ``AppendResult(stored=False)``). A record whose ``id`` is already stored, or an entry that
    cannot be encoded, fails the op, and only that op. ``records`` may be empty.

    With a ``fence`` (:class:`Fence`) the op lands only while that lease is current; a stale
    one stores nothing, takes no dedupe key and journals nothing.
    """

    records: tuple[MessageRecord, ...] = attrs.field(
        validator=attrs.validators.deep_iterable(
            member_validator=attrs.validators.instance_of(MessageRecord),
            iterable_validator=attrs.validators.instance_of(tuple),
        )
    )
    dedupe: tuple[str, str, str] | None = attrs.field(default=None, validator=_dedupe_key)
    journal: tuple[JournalEntry, ...] = attrs.field(default=(), validator=_journal_entries)
    fence: Fence | None = attrs.field(default=None, validator=_fence)

    def __reduce__(self) -> tuple[Any, ...]:
        return _trusted, (
            Append,
            _APPEND_FIELDS,
            (self.records, self.dedupe, self.journal, self.fence),
        )


@attrs.frozen(kw_only=True)
class AppendResult:
    """``stored`` is False when the op's dedupe key was already present (nothing written)."""

    stored: bool


@attrs.frozen(kw_only=True)
class PutState:
    """Set ``namespace/key`` to ``value`` (any CBOR-encodable value); ``None`` deletes the key.
    With a ``fence``, only while that lease is current (see :class:`Append`)."""

    namespace: str = attrs.field(validator=attrs.validators.instance_of(str))
    key: str = attrs.field(validator=attrs.validators.instance_of(str))
    value: Any
    fence: Fence | None = attrs.field(default=None, validator=_fence)


def _seq_bound(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name} must be an int >= 0, got {value!r}")


@attrs.frozen(kw_only=True)
class TrimJournal:
    """Delete, in one transaction, every journal row of ``stream`` whose seq is below
    ``before_seq`` (the row at ``before_seq`` itself is kept). Other streams are untouched.
    With a ``fence``, only while that lease is current (see :class:`Append`)."""

    stream: str = attrs.field(validator=_non_empty_str)
    before_seq: int = attrs.field(validator=_seq_bound)
    fence: Fence | None = attrs.field(default=None, validator=_fence)


def _optional_str(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{attribute.name} must be a string or None, got {value!r}")


def _count(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name} must be an int >= 0, got {value!r}")


#: The ways a turn recorded in the usage ledger may have ended.
USAGE_PHASES = frozenset({"completed", "aborted", "failed"})


def _phase(_inst: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in USAGE_PHASES:
        raise ValueError(f"phase must be one of {sorted(USAGE_PHASES)}, got {value!r}")


@attrs.frozen(kw_only=True)
class RecordUsage:
    """One row of the usage ledger: what one turn of ``agent`` spent on ``model`` (``calls``
    model calls, their tokens summed), at ``at`` (seconds since the epoch). ``turn`` is the
    turn's index, ``turn_id`` its inference id; ``server``/``channel`` the wake that caused it
    (None when none did). ``phase`` is how the turn ended; ``silent`` that it produced no
    output (no text, no tool call but the quiet ones). With a ``fence``, the row lands only
    while that lease is current (see :class:`Append`)."""

    at: float = attrs.field(validator=_finite_number)
    agent: str = attrs.field(validator=_non_empty_str)
    model: str = attrs.field(validator=_non_empty_str)
    turn: int = attrs.field(validator=_count)
    turn_id: str = attrs.field(validator=_non_empty_str)
    server: str | None = attrs.field(default=None, validator=_optional_str)
    channel: str | None = attrs.field(default=None, validator=_optional_str)
    phase: str = attrs.field(validator=_phase)
    silent: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    calls: int = attrs.field(validator=_count)
    input_tokens: int = attrs.field(default=0, validator=_count)
    output_tokens: int = attrs.field(default=0, validator=_count)
    cache_read_tokens: int = attrs.field(default=0, validator=_count)
    cache_write_tokens: int = attrs.field(default=0, validator=_count)
    fence: Fence | None = attrs.field(default=None, validator=_fence)

    def row(self) -> tuple[Any, ...]:
        """The values of a ``usage`` row, in :data:`USAGE_COLUMNS` order."""
        return tuple(getattr(self, name) for name in USAGE_COLUMNS)


#: The columns of the ``usage`` table a :class:`RecordUsage` fills (see :mod:`store.schema`).
USAGE_COLUMNS = (
    "at",
    "agent",
    "model",
    "turn",
    "turn_id",
    "server",
    "channel",
    "phase",
    "silent",
    "calls",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
)

#: The newest rows of the audit record kept: writing one more removes the oldest past this many
#: (in the same transaction). Operators act at a human pace; this is years of actions.
AUDIT_KEEP = 100_000


@attrs.frozen(kw_only=True)
class RecordAudit:
    """One row of the audit record: an operator's ``action`` (``pause``, ``resume``,
    ``reconnect``, ``resend``, ``dismiss``, …) on ``target`` (an agent's name, a server's id) at
    ``at`` (seconds since the epoch), where it came from (``source``: ``console 127.0.0.1``,
    ``SIGHUP``, ``cli``, ``api``), whether it ``changed`` anything, and its outcome in a few
    words (``detail``). At most :data:`AUDIT_KEEP` rows are kept, the oldest go first."""

    at: float = attrs.field(validator=_finite_number)
    action: str = attrs.field(validator=_non_empty_str)
    target: str = attrs.field(validator=_non_empty_str)
    source: str = attrs.field(validator=_non_empty_str)
    changed: bool = attrs.field(validator=attrs.validators.instance_of(bool))
    detail: str = attrs.field(default="", validator=attrs.validators.instance_of(str))

    def row(self) -> tuple[Any, ...]:
        """The values of an ``audit`` row, in :data:`AUDIT_COLUMNS` order."""
        return tuple(getattr(self, name) for name in AUDIT_COLUMNS)


#: The columns of the ``audit`` table a :class:`RecordAudit` fills (see :mod:`store.schema`).
AUDIT_COLUMNS = ("at", "action", "target", "source", "changed", "detail")

_APPEND_FIELDS = ("records", "dedupe", "journal", "fence")

#: A write operation.
Op: TypeAlias = Append | PutState | TrimJournal | RecordUsage | RecordAudit
#: The ops that may carry a :class:`Fence`.
FENCED_OPS = (Append, PutState, TrimJournal, RecordUsage)


def fence_of(op: Op) -> Fence | None:
    """The lease ``op`` is made for, if any (a :class:`RecordAudit` is made for none)."""
    return op.fence if isinstance(op, FENCED_OPS) else None


#: What a successful op yields.
OpResult: TypeAlias = AppendResult | None
#: What an op yields in a batch: its result, or the error that failed it alone.
Outcome: TypeAlias = AppendResult | StoreError | None
