"""RFC-006 event coalescing: the pure bookkeeping (revision 8).

One rule drives everything here: *an occurrence nobody has read may be changed by its sender;
an occurrence a model has read is history and is never rewritten.* This module keeps the
per-subject state that applies the rule and tells the host what to do. It performs no I/O,
reads no clock (``now`` is a parameter, in milliseconds) and sends nothing: every transition
returns a :class:`Step` holding the outcome, the *effects* the host must carry out in order,
and the *journal records* it must make durable together with those effects.

Wire side
    :func:`parse_coalesce` validates the ``coalesce`` member of a ``push/event`` (lane
    ``"push"``) or of one ``channels/incoming`` message (lane ``"incoming"``) against the
    host's :class:`Advertisement`. A malformed member gives :class:`CoalesceInvalid`
    ``(field, reason)``: on ``push/event`` the host answers ``-32602`` with
    ``data: {field, reason}``; on ``channels/incoming`` that message's result is
    ``{accepted: false, reason: "coalesce_invalid"}``. Members this version does not know are
    ignored (MCPL is an extension protocol).

Subjects
    A subject is ``(binding, scope_kind, scope_id, key)`` (:class:`Subject`). ``push/event``
    is feature-set scoped unless ``coalesce.channelId`` names a channel; a
    ``channels/incoming`` message is scoped to its channel. The binding identity is the
    host's: it must survive reconnects and change when a configuration is reassigned.

Contexts and consumption
    A *context* is whatever the host assembles model requests from (an agent). The host says
    which contexts an occurrence reaches (``contexts=``) and, after building a request, which
    occurrences it included (:meth:`Coalescer.assembled`). Consumption is tracked **per
    context**: an unread occurrence is replaced where it is unread and kept (with the new one
    appended) where it was read. History is the tri-state ``none`` / ``some`` / ``unknown``
    per context; the reported outcome is the most conservative one across the contexts
    (``appended`` over ``replaced``; ``noted`` or ``consumed`` over ``retracted``). A
    rendered (materialized) occurrence is the exception: once any context consumes it, it is
    sealed in every context it reached, so later deltas keep their baseline (RFC §3.3).
    An audience never widens: a replacement reaches only contexts the replaced work reached.

Deferred batches (RFC §5.4)
    ``∅ → PENDING → RENDERING → CLOSED``. :meth:`Coalescer.begin_assembly` freezes each
    pending batch a context would see and asks for ``push/render``; notices arriving while it
    renders open a new pending batch (``"first"``), which waits until the render completes
    (at most **one render in flight per subject**). Completion closes only the frozen batch:
    a result materializes it, empty content materializes nothing, a timeout, error or
    disconnect materializes the fallback, lapsed authority materializes nothing. Exactly one
    materialization per batch: a completion for a batch that is no longer rendering
    (fallback already materialized, cancelled by a retraction or a plain occurrence,
    evicted, recovered) is ``"discarded"``.

Capacity (every table is bounded, and nothing is refused for lack of room)
    * ``MAX_SUBJECTS`` (4096) tracked subjects. A new subject at the cap evicts the least
      recently touched one (touched = named by an admission or retraction, its occupant
      consumed, its render started or completed). The evicted subject's unread occupant
      stays in the contexts as an ordinary occurrence, its pending or rendering batch
      materializes as its fallback (a late render result is then discarded), and its history
      is forgotten, i.e. ``unknown`` (an untracked subject is ``unknown``). Admission goes
      on: coalescing capacity is never a reason to refuse (RFC §11).
    * ``MAX_NOTICES`` (64) notices per batch, newest kept; older ones are counted in
      ``dropped``.
    * Retry receipts: an admitted coalesced ``eventId`` (per binding) is remembered with its
      result for the retry window advertised when it was admitted (at least 3,600,000 ms) and
      a retry inside the window gets the original result with no effects. At most
      ``MAX_RECEIPTS`` (100,000), kept in admission order: expired receipts at the front are
      purged on each admission and, at the cap, the oldest receipt is dropped even if its
      window is still open (a retry of that occurrence is then a new occurrence).

Durability
    The journal is a command log: every record is a plain JSON-able dict with ``"v": 1`` and
    an ``"op"`` (see :data:`RECORD_OPS`), carrying the resolved inputs of one transition
    (``now``, the contexts, which batches an assembly rendered or dropped). Records must be
    durable before, or atomically with, the effects they imply (write-ahead; a host that
    appends content and the record in one store transaction meets this).
    :meth:`Coalescer.replay` rebuilds the exact state, receipts included; :meth:`snapshot`
    gives one ``"snapshot"`` record that replays to the same state, for compacting a journal.
    After a restart the host may keep everything replaceable (plain replay) or call
    :meth:`Coalescer.recover` (the conservative policy): unread occupants become ordinary
    occurrences, in-flight renders fall back (never re-rendered), pending batches stay
    pending (they were never shown), and every subject that had unread or rendering work gets
    history ``unknown`` (``history_lost=True`` does that for every subject).

Identifiers
    Occurrence ids are the host's (unique, opaque). Batch ids are minted here as
    ``id_prefix`` + a counter (default ``"coalesced:1"``, …); a materialized batch is stored
    under its batch id, so host ids must not use that prefix.

Effects, applied in order by one actor
    :class:`Append` (store the admitted occurrence's own content in these contexts),
    :class:`Hide` (remove an unread occurrence from these contexts without trace),
    :class:`RequestRender` (send ``push/render`` with these params), :class:`Materialize`
    (store this content as an ordinary occurrence in these contexts) and :class:`Audit`
    (informational: what was displaced, withdrawn, cancelled, dropped, discarded, evicted or
    sealed; never model-visible).
"""

from __future__ import annotations

import enum
import json
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias

import attrs

__all__ = [
    "ABSENT",
    "JOURNAL_VERSION",
    "MAX_DATA_BYTES",
    "MAX_KEY_BYTES",
    "MAX_NOTICES",
    "MAX_RECEIPTS",
    "MAX_SUBJECTS",
    "MIN_RETRY_WINDOW_MS",
    "RECORD_OPS",
    "Advertisement",
    "Append",
    "Audit",
    "BatchView",
    "CoalesceInvalid",
    "CoalesceSpec",
    "Coalescer",
    "Effect",
    "Hide",
    "Materialize",
    "RequestRender",
    "Step",
    "Subject",
    "SubjectView",
    "inference_needed",
    "parse_coalesce",
]

Lane: TypeAlias = Literal["push", "incoming"]
ScopeKind: TypeAlias = Literal["featureSet", "channel"]
History: TypeAlias = Literal["none", "some", "unknown"]

MAX_KEY_BYTES: Final = 256
MAX_DATA_BYTES: Final = 4096
MIN_RETRY_WINDOW_MS: Final = 3_600_000
MAX_SUBJECTS: Final = 4096
MAX_NOTICES: Final = 64
MAX_RECEIPTS: Final = 100_000
JOURNAL_VERSION: Final = 1
RECORD_OPS: Final = (
    "advertise",
    "plain",
    "notice",
    "retract",
    "begin",
    "rendered",
    "failed",
    "lapsed",
    "assembled",
    "recover",
    "snapshot",
)
FAILURE_REASONS: Final = ("timeout", "error", "disconnect")


class _Absent(enum.Enum):
    ABSENT = "absent"

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Final = _Absent.ABSENT
"""``coalesce.data`` was not sent (``null`` is a value and is handed back as ``null``)."""


# --------------------------------------------------------------------------------------------
# Advertisement and validation


def _leaf(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not bool:
        raise TypeError(f"{attribute.name} must be a boolean")


def _window(_instance: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not int or value < MIN_RETRY_WINDOW_MS:
        raise ValueError(f"retry_window_ms must be an integer >= {MIN_RETRY_WINDOW_MS}")


@attrs.frozen(kw_only=True)
class Advertisement:
    """The host's ``capabilities.experimental.mcpl.eventCoalescing`` (all features by default)."""

    push_events: bool = attrs.field(default=True, validator=_leaf)
    channels_incoming: bool = attrs.field(default=True, validator=_leaf)
    deferred: bool = attrs.field(default=True, validator=_leaf)
    channel_scoped_push: bool = attrs.field(default=True, validator=_leaf)
    retry_window_ms: int = attrs.field(default=MIN_RETRY_WINDOW_MS, validator=_window)

    def to_wire(self) -> dict[str, bool | int]:
        """The manifest value, always in the explicit object form (``true`` means the same as
        the default object)."""
        return {
            "pushEvents": self.push_events,
            "channelsIncoming": self.channels_incoming,
            "deferred": self.deferred,
            "channelScopedPush": self.channel_scoped_push,
            "retryWindowMs": self.retry_window_ms,
        }

    @classmethod
    def from_wire(cls, value: object) -> Advertisement:
        """Read an advertisement: ``true``, ``false`` / absent (nothing advertised) or the
        object form, whose omitted leaves are not advertised. Raises ``ValueError``."""
        if value is True:
            return cls()
        if value is None or value is False:
            return cls(
                push_events=False,
                channels_incoming=False,
                deferred=False,
                channel_scoped_push=False,
            )
        if not isinstance(value, Mapping):
            raise ValueError("eventCoalescing must be a boolean or an object")
        leaves = {}
        for wire, name in (
            ("pushEvents", "push_events"),
            ("channelsIncoming", "channels_incoming"),
            ("deferred", "deferred"),
            ("channelScopedPush", "channel_scoped_push"),
        ):
            leaf = value.get(wire, False)
            if type(leaf) is not bool:
                raise ValueError(f"eventCoalescing.{wire} must be a boolean")
            leaves[name] = leaf
        window = value.get("retryWindowMs", MIN_RETRY_WINDOW_MS)
        if type(window) is not int or window < MIN_RETRY_WINDOW_MS:
            raise ValueError(
                f"eventCoalescing.retryWindowMs must be an integer >= {MIN_RETRY_WINDOW_MS}"
            )
        return cls(retry_window_ms=window, **leaves)

    def lane(self, lane: Lane) -> bool:
        """Whether ``coalesce`` is advertised on this lane."""
        return self.push_events if lane == "push" else self.channels_incoming


@attrs.frozen
class CoalesceInvalid:
    """A malformed ``coalesce`` member: ``field`` is the wire path, ``reason`` a stable code."""

    field: str
    reason: str

    def error_data(self) -> dict[str, str]:
        """``data`` of the ``-32602`` error on ``push/event``."""
        return {"field": self.field, "reason": self.reason}


@attrs.frozen(kw_only=True)
class Subject:
    """``(binding, scope kind, scope id, key)``: what one slot belongs to."""

    binding: str
    scope_kind: ScopeKind
    scope_id: str
    key: str

    def to_json(self) -> list[str]:
        return [self.binding, self.scope_kind, self.scope_id, self.key]

    @classmethod
    def from_json(cls, value: Any) -> Subject:
        binding, kind, scope_id, key = value
        if kind not in ("featureSet", "channel"):
            raise ValueError(f"unknown scope kind {kind!r}")
        return cls(binding=binding, scope_kind=kind, scope_id=scope_id, key=key)


@attrs.frozen(kw_only=True)
class CoalesceSpec:
    """A valid ``coalesce`` member, with the occurrence's ``eventId``."""

    lane: Lane
    key: str
    event_id: str
    channel_id: str | None = None
    deferred: bool = False
    retract: bool = False
    initial: bool = False
    data: Any = ABSENT

    @property
    def mode(self) -> Literal["plain", "deferred", "retract"]:
        if self.retract:
            return "retract"
        return "deferred" if self.deferred else "plain"

    def subject(
        self, *, binding: str, feature_set: str | None = None, channel_id: str | None = None
    ) -> Subject:
        """The subject: a ``push/event`` names its ``feature_set``; a ``channels/incoming``
        message names its ``channel_id``. Scope is never taken from ``origin``."""
        if self.lane == "incoming":
            if channel_id is None:
                raise ValueError("a channels/incoming subject needs the message's channelId")
            return Subject(binding=binding, scope_kind="channel", scope_id=channel_id, key=self.key)
        if self.channel_id is not None:
            return Subject(
                binding=binding, scope_kind="channel", scope_id=self.channel_id, key=self.key
            )
        if feature_set is None:
            raise ValueError("a feature-set scoped subject needs the event's featureSet")
        return Subject(binding=binding, scope_kind="featureSet", scope_id=feature_set, key=self.key)


def _compact(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _string(value: object, field: str, *, allow_empty: bool = False) -> CoalesceInvalid | None:
    if value is None:
        return CoalesceInvalid(field, "required")
    if not isinstance(value, str):
        return CoalesceInvalid(field, "not_a_string")
    if not value and not allow_empty:
        return CoalesceInvalid(field, "empty")
    try:
        value.encode()
    except UnicodeEncodeError:
        return CoalesceInvalid(field, "not_utf8")
    return None


def parse_coalesce(
    raw: object, *, lane: Lane, advertised: Advertisement, event_id: object
) -> CoalesceSpec | CoalesceInvalid:
    """Validate a ``coalesce`` member (RFC §13) on ``lane``.

    ``event_id`` is the occurrence's ``eventId`` (``None`` when absent); it must be a
    non-empty string on both lanes (``push/event`` requires it anyway). Reasons:
    ``not_advertised``, ``not_an_object``, ``required``, ``not_a_string``, ``empty``,
    ``not_utf8``, ``too_long``, ``not_a_boolean``, ``not_allowed_on_lane``,
    ``conflicts_with_deferred``, ``conflicts_with_initial``, ``requires_deferred``,
    ``too_large``, ``not_json``.
    """
    if not advertised.lane(lane):
        return CoalesceInvalid("coalesce", "not_advertised")
    if not isinstance(raw, Mapping):
        return CoalesceInvalid("coalesce", "not_an_object")
    key = raw.get("key")
    bad = _string(key, "coalesce.key")
    if bad is not None:
        return bad
    assert isinstance(key, str)
    if len(key.encode()) > MAX_KEY_BYTES:
        return CoalesceInvalid("coalesce.key", "too_long")
    for name in ("channelId", "deferred"):
        if name in raw and lane == "incoming":
            return CoalesceInvalid(f"coalesce.{name}", "not_allowed_on_lane")
    flags: dict[str, bool] = {}
    for name in ("deferred", "retract", "initial"):
        value = raw.get(name, False)
        if type(value) is not bool:
            return CoalesceInvalid(f"coalesce.{name}", "not_a_boolean")
        flags[name] = value
    channel_id = raw.get("channelId")
    if "channelId" in raw:
        bad = _string(channel_id if channel_id is not None else 0, "coalesce.channelId")
        if bad is not None:
            return bad
        if not advertised.channel_scoped_push:
            return CoalesceInvalid("coalesce.channelId", "not_advertised")
    if "deferred" in raw and not advertised.deferred:
        return CoalesceInvalid("coalesce.deferred", "not_advertised")
    if flags["retract"] and flags["deferred"]:
        return CoalesceInvalid("coalesce.retract", "conflicts_with_deferred")
    if flags["retract"] and flags["initial"]:
        return CoalesceInvalid("coalesce.retract", "conflicts_with_initial")
    data: Any = ABSENT
    if "data" in raw:
        if not flags["deferred"]:
            return CoalesceInvalid("coalesce.data", "requires_deferred")
        data = raw["data"]
        try:
            size = len(_compact(data))
        except (TypeError, ValueError):
            return CoalesceInvalid("coalesce.data", "not_json")
        if size > MAX_DATA_BYTES:
            return CoalesceInvalid("coalesce.data", "too_large")
    bad = _string(event_id, "eventId")
    if bad is not None:
        return bad
    assert isinstance(event_id, str)
    return CoalesceSpec(
        lane=lane,
        key=key,
        event_id=event_id,
        channel_id=channel_id if isinstance(channel_id, str) else None,
        deferred=flags["deferred"],
        retract=flags["retract"],
        initial=flags["initial"],
        data=data,
    )


# --------------------------------------------------------------------------------------------
# Effects and steps


@attrs.frozen
class Append:
    """Store the admitted occurrence (its own content, held by the host) in these contexts."""

    occurrence: str
    contexts: frozenset[str]


@attrs.frozen
class Hide:
    """Remove this unread occurrence from these contexts, leaving no trace in model context."""

    occurrence: str
    contexts: frozenset[str]


@attrs.frozen
class RequestRender:
    """Send ``push/render`` with ``params`` to the subject's server; answer with
    :meth:`Coalescer.render_result` or :meth:`Coalescer.render_failed` for ``batch``."""

    batch: str
    subject: Subject
    params: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class Materialize:
    """Store ``content`` as an ordinary durable occurrence named ``occurrence`` in these
    contexts, with the batch's tags, latest origin and ``timestamp`` (``None``: receipt time).
    ``source`` is ``"result"`` or ``"fallback"``."""

    batch: str
    occurrence: str
    subject: Subject
    contexts: frozenset[str]
    content: tuple[Any, ...]
    source: Literal["result", "fallback"]
    event_id: str
    feature_set: str
    tags: tuple[str, ...]
    timestamp: str | None
    origin: Any


@attrs.frozen(kw_only=True)
class Audit:
    """For the audit record only (RFC §11). Kinds: ``displaced``, ``withdrawn``,
    ``superseded``, ``cancelled``, ``narrowed``, ``dropped``, ``discarded``, ``empty``,
    ``evicted``, ``sealed``."""

    kind: str
    subject: Subject | None
    event_ids: tuple[str, ...] = ()
    batch: str | None = None


Effect: TypeAlias = Append | Hide | RequestRender | Materialize | Audit


@attrs.frozen(kw_only=True)
class Step:
    """The result of one transition. ``outcome`` is the wire outcome for an admission
    (``first``, ``replaced``, ``appended``, ``retracted``, ``noted``, ``consumed``), a render
    outcome (``materialized``, ``empty``, ``fallback``, ``dropped``, ``discarded``) or
    ``None``. ``records`` must be journaled; ``duplicate`` marks a retry inside the window."""

    outcome: str | None
    effects: tuple[Effect, ...] = ()
    records: tuple[dict[str, Any], ...] = ()
    prior_event_id: str | None = None
    duplicate: bool = False

    def result(self) -> dict[str, str]:
        """The ``coalesce`` member of the ``push/event`` or per-message result."""
        if self.outcome is None:
            raise ValueError("this step is not an admission")
        out = {"outcome": self.outcome}
        if self.prior_event_id is not None:
            out["priorEventId"] = self.prior_event_id
        return out


@attrs.frozen(kw_only=True)
class BatchView:
    """A pending batch as :meth:`Coalescer.begin_assembly` shows it to the authority check."""

    batch: str
    subject: Subject
    feature_set: str
    event_id: str
    notices: int
    dropped: int
    contexts: frozenset[str]


@attrs.frozen(kw_only=True)
class RenderingView:
    """A batch being rendered: what the host needs to build its fallback and its result."""

    batch: str
    feature_set: str
    event_id: str
    fallback: tuple[Any, ...]
    timestamp: str
    tags: tuple[str, ...]
    origin: Any
    audience: frozenset[str]


@attrs.frozen(kw_only=True)
class SubjectView:
    """A read-only view of one tracked subject."""

    subject: Subject
    history: History
    occupant: str | None
    occupant_kind: Literal["plain", "materialized"] | None
    unread: frozenset[str]
    pending: str | None
    pending_notices: int
    dropped: int
    rendering: str | None


def inference_needed(*, other_causes: bool, render_outcomes: Iterable[str]) -> bool:
    """Revision 8 (§5.2): an inference whose only causes were deferred batches runs only if
    its assembly materialized something (a result or a fallback)."""
    return other_causes or any(o in ("materialized", "fallback") for o in render_outcomes)


# --------------------------------------------------------------------------------------------
# State


@attrs.frozen
class _Notice:
    event_id: str
    timestamp: str
    data: Any

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"eventId": self.event_id, "timestamp": self.timestamp}
        if self.data is not ABSENT:
            out["data"] = self.data
        return out


@attrs.define
class _Occupant:
    occurrence: str
    event_id: str
    kind: Literal["plain", "materialized"]
    delivered: frozenset[str]
    unread: set[str]


@attrs.define
class _Batch:
    id: str
    feature_set: str
    notices: list[_Notice]
    dropped: int
    fallback: tuple[Any, ...]
    event_id: str
    timestamp: str
    tags: tuple[str, ...]
    origin: Any
    audience: frozenset[str]
    context: str | None = None


@attrs.define
class _Slot:
    base: Literal["none", "unknown"]
    hist: dict[str, Literal["some", "unknown"]] = attrs.Factory(dict)
    occupant: _Occupant | None = None
    batch: _Batch | None = None
    rendering: _Batch | None = None
    last_consumed: str | None = None


@attrs.frozen
class _Receipt:
    outcome: str
    prior: str | None
    at: int
    window: int


_Applied: TypeAlias = tuple[str | None, list[Effect], str | None]


def _json(value: Any) -> Any:
    """A private, plain-JSON copy (raises on values JSON cannot carry)."""
    return json.loads(json.dumps(value, allow_nan=False))


def _json_object(value: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = _json(value)
    return out


def _contexts(value: Iterable[str]) -> frozenset[str]:
    out = frozenset(value)
    if not all(isinstance(c, str) for c in out):
        raise TypeError("contexts are strings")
    return out


class Coalescer:
    """The subject table of one host (all bindings). Call it from one actor, one step at a
    time; it is not thread-safe and never awaits."""

    def __init__(
        self,
        *,
        max_subjects: int = MAX_SUBJECTS,
        max_notices: int = MAX_NOTICES,
        max_receipts: int = MAX_RECEIPTS,
        retry_window_ms: int = MIN_RETRY_WINDOW_MS,
        id_prefix: str = "coalesced:",
    ) -> None:
        if max_subjects < 1 or max_receipts < 1:
            raise ValueError("max_subjects and max_receipts must be at least 1")
        if max_notices < MAX_NOTICES:
            raise ValueError(f"RFC-006 requires at least {MAX_NOTICES} retained notices")
        _window(None, None, retry_window_ms)  # type: ignore[arg-type]
        self._max_subjects = max_subjects
        self._max_notices = max_notices
        self._max_receipts = max_receipts
        self._prefix = id_prefix
        self._window = retry_window_ms
        self._seq = 0
        self._subjects: OrderedDict[Subject, _Slot] = OrderedDict()
        self._occupants: dict[str, Subject] = {}
        self._batches: dict[str, Subject] = {}
        self._receipts: OrderedDict[tuple[str, str], _Receipt] = OrderedDict()

    # ---------------------------------------------------------------- inspection

    def __len__(self) -> int:
        return len(self._subjects)

    def __contains__(self, subject: object) -> bool:
        return subject in self._subjects

    @property
    def retry_window_ms(self) -> int:
        """The window that receipts admitted now will get."""
        return self._window

    @property
    def receipt_count(self) -> int:
        return len(self._receipts)

    def subjects(self) -> tuple[Subject, ...]:
        """Tracked subjects, least recently touched first."""
        return tuple(self._subjects)

    def history(self, subject: Subject, context: str | None = None) -> History:
        """The subject's history in ``context``, or the most conservative across contexts."""
        slot = self._subjects.get(subject)
        if context is not None:
            return self._hist(slot, context)
        return self._summary(slot)

    def view(self, subject: Subject) -> SubjectView | None:
        slot = self._subjects.get(subject)
        if slot is None:
            return None
        occ = slot.occupant
        return SubjectView(
            subject=subject,
            history=self._summary(slot),
            occupant=None if occ is None else occ.occurrence,
            occupant_kind=None if occ is None else occ.kind,
            unread=frozenset() if occ is None else frozenset(occ.unread),
            pending=None if slot.batch is None else slot.batch.id,
            pending_notices=0 if slot.batch is None else len(slot.batch.notices),
            dropped=0 if slot.batch is None else slot.batch.dropped,
            rendering=None if slot.rendering is None else slot.rendering.id,
        )

    def subject_of(self, occurrence: str) -> Subject | None:
        """The subject whose unread occupant ``occurrence`` is, if any."""
        return self._occupants.get(occurrence)

    def receipt(self, binding: str, event_id: str, *, now: int) -> dict[str, str] | None:
        """The original ``coalesce`` result of an admitted occurrence still in its window."""
        hit = self._duplicate(binding, event_id, now)
        return None if hit is None else hit.result()

    def rendering(self, subject: Subject) -> RenderingView | None:
        """The batch of ``subject`` being rendered (frozen by an assembly), if any."""
        slot = self._subjects.get(subject)
        b = slot.rendering if slot is not None else None
        if b is None:
            return None
        return RenderingView(
            batch=b.id,
            feature_set=b.feature_set,
            event_id=b.event_id,
            fallback=b.fallback,
            timestamp=b.timestamp,
            tags=b.tags,
            origin=b.origin,
            audience=b.audience,
        )

    def pending_batches(self, context: str) -> tuple[BatchView, ...]:
        """Pending batches an assembly for ``context`` would render now."""
        out = []
        for subject, slot in self._subjects.items():
            b = slot.batch
            if b is not None and slot.rendering is None and context in b.audience:
                out.append(
                    BatchView(
                        batch=b.id,
                        subject=subject,
                        feature_set=b.feature_set,
                        event_id=b.event_id,
                        notices=len(b.notices),
                        dropped=b.dropped,
                        contexts=b.audience,
                    )
                )
        return tuple(out)

    # ---------------------------------------------------------------- transitions

    def advertise(self, advertisement: Advertisement) -> Step:
        """A (re)initialization advertised ``advertisement``: later admissions get its window;
        receipts keep the window they were admitted under."""
        return self._run({"op": "advertise", "window_ms": advertisement.retry_window_ms})

    def admit(
        self,
        spec: CoalesceSpec,
        *,
        binding: str,
        occurrence: str,
        contexts: Iterable[str],
        now: int,
        feature_set: str | None = None,
        channel_id: str | None = None,
        content: Sequence[Any] = (),
        timestamp: str = "",
        tags: Sequence[str] = (),
        origin: Any = None,
    ) -> Step:
        """Dispatch an occurrence that passed ordinary admission (grant, feature set, channel
        checks) by its mode. ``content`` is the payload (the fallback of a deferred notice;
        empty content makes a retraction a pure withdrawal)."""
        subject = spec.subject(binding=binding, feature_set=feature_set, channel_id=channel_id)
        if spec.retract:
            return self.retract(
                subject,
                event_id=spec.event_id,
                occurrence=occurrence,
                notice=bool(content),
                contexts=contexts,
                now=now,
            )
        if spec.deferred:
            if feature_set is None:
                raise ValueError("a deferred notice needs its featureSet")
            return self.admit_notice(
                subject,
                event_id=spec.event_id,
                feature_set=feature_set,
                fallback=content,
                contexts=contexts,
                timestamp=timestamp,
                initial=spec.initial,
                data=spec.data,
                tags=tags,
                origin=origin,
                now=now,
            )
        return self.admit_plain(
            subject,
            event_id=spec.event_id,
            occurrence=occurrence,
            contexts=contexts,
            initial=spec.initial,
            now=now,
        )

    def admit_plain(
        self,
        subject: Subject,
        *,
        event_id: str,
        occurrence: str,
        contexts: Iterable[str],
        now: int,
        initial: bool = False,
    ) -> Step:
        """A plain occurrence (RFC §4): ``first``, ``replaced`` or ``appended``."""
        hit = self._duplicate(subject.binding, event_id, now)
        if hit is not None:
            return hit
        return self._run(
            {
                "op": "plain",
                "at": now,
                "subject": subject.to_json(),
                "event_id": event_id,
                "occurrence": occurrence,
                "contexts": sorted(_contexts(contexts)),
                "initial": bool(initial),
            }
        )

    def admit_notice(
        self,
        subject: Subject,
        *,
        event_id: str,
        feature_set: str,
        fallback: Sequence[Any],
        contexts: Iterable[str],
        timestamp: str,
        now: int,
        initial: bool = False,
        data: Any = ABSENT,
        tags: Sequence[str] = (),
        origin: Any = None,
    ) -> Step:
        """A deferred notice (RFC §5.1): ``first`` or ``replaced``."""
        hit = self._duplicate(subject.binding, event_id, now)
        if hit is not None:
            return hit
        record: dict[str, Any] = {
            "op": "notice",
            "at": now,
            "subject": subject.to_json(),
            "event_id": event_id,
            "feature_set": feature_set,
            "contexts": sorted(_contexts(contexts)),
            "initial": bool(initial),
            "timestamp": timestamp,
            "fallback": _json(list(fallback)),
            "tags": [str(t) for t in tags],
            "origin": _json(origin),
        }
        if data is not ABSENT:
            record["data"] = _json(data)
        return self._run(record)

    def retract(
        self,
        subject: Subject,
        *,
        event_id: str,
        occurrence: str,
        notice: bool,
        contexts: Iterable[str],
        now: int,
    ) -> Step:
        """A retraction (RFC §6): ``retracted``, ``noted`` or ``consumed``. ``notice`` says
        whether the deletion notice (the payload, stored by the host as ``occurrence``) is
        non-empty."""
        hit = self._duplicate(subject.binding, event_id, now)
        if hit is not None:
            return hit
        return self._run(
            {
                "op": "retract",
                "at": now,
                "subject": subject.to_json(),
                "event_id": event_id,
                "occurrence": occurrence,
                "contexts": sorted(_contexts(contexts)),
                "notice": bool(notice),
            }
        )

    def begin_assembly(
        self, context: str, *, authorized: Callable[[BatchView], bool] | None = None
    ) -> Step:
        """An assembly for ``context`` begins: every pending batch it would see starts
        rendering (:class:`RequestRender`) if ``authorized`` (feature set enabled,
        ``pushEvents`` granted, channel checks) says so, else it is dropped without a render."""
        render: list[str] = []
        drop: list[str] = []
        for view in self.pending_batches(context):
            (render if authorized is None or authorized(view) else drop).append(view.batch)
        if not render and not drop:
            return Step(outcome=None)
        return self._run({"op": "begin", "context": context, "render": render, "drop": drop})

    def render_result(
        self,
        batch: str,
        content: Sequence[Any],
        *,
        authorized: bool,
        timestamp: str | None = None,
    ) -> Step:
        """The server answered ``push/render`` with ``content`` (already admitted as content by
        the host; a result that fails those checks is an error). ``authorized`` is the
        re-check of the batch's authority at response."""
        if not self._is_rendering(batch):
            return self._discarded(batch)
        if not authorized:
            return self._run({"op": "lapsed", "batch": batch})
        return self._run(
            {"op": "rendered", "batch": batch, "empty": not content},
            content=tuple(_json(list(content))),
            timestamp=timestamp,
        )

    def render_failed(
        self, batch: str, *, reason: Literal["timeout", "error", "disconnect"], authorized: bool
    ) -> Step:
        """The render timed out, failed or its server is gone: the fallback materializes (if
        the batch is still rendering and still authorized)."""
        if reason not in FAILURE_REASONS:
            raise ValueError(f"unknown render failure {reason!r}")
        if not self._is_rendering(batch):
            return self._discarded(batch)
        if not authorized:
            return self._run({"op": "lapsed", "batch": batch})
        return self._run({"op": "failed", "batch": batch, "reason": reason})

    def assembled(self, context: str, occurrences: Iterable[str]) -> Step:
        """A request for ``context`` was assembled with these occurrences (ordinary ones are
        ignored): they are consumed there, permanently, even if the request later fails."""
        relevant = []
        for occurrence in occurrences:
            subject = self._occupants.get(occurrence)
            if subject is None or occurrence in relevant:
                continue
            occ = self._subjects[subject].occupant
            assert occ is not None and occ.occurrence == occurrence
            if (occ.kind == "plain" and context in occ.unread) or (
                occ.kind == "materialized" and context in occ.delivered
            ):
                relevant.append(occurrence)
        if not relevant:
            return Step(outcome=None)
        return self._run({"op": "assembled", "context": context, "occurrences": relevant})

    def recover(self, *, history_lost: bool = False) -> Step:
        """Conservative recovery after a restart (see the module docstring)."""
        return self._run({"op": "recover", "history_lost": bool(history_lost)})

    # ---------------------------------------------------------------- durability

    def snapshot(self) -> dict[str, Any]:
        """One journal record that replays to this exact state."""
        return {"v": JOURNAL_VERSION, "op": "snapshot", "state": self._state()}

    @classmethod
    def replay(cls, records: Iterable[Mapping[str, Any]], **limits: Any) -> Coalescer:
        """Rebuild a coalescer from its journal (give the same limits it was created with)."""
        co = cls(**limits)
        for record in records:
            co._apply(record, {})
        return co

    # ---------------------------------------------------------------- machinery

    def _run(self, record: dict[str, Any], **aux: Any) -> Step:
        record = {"v": JOURNAL_VERSION, **record}
        outcome, effects, prior = self._apply(record, aux)
        return Step(
            outcome=outcome, effects=tuple(effects), records=(record,), prior_event_id=prior
        )

    def _apply(self, record: Mapping[str, Any], aux: Mapping[str, Any]) -> _Applied:
        if record.get("v") != JOURNAL_VERSION:
            raise ValueError(f"unknown journal record version {record.get('v')!r}")
        handler = _HANDLERS.get(str(record.get("op")))
        if handler is None:
            raise ValueError(f"unknown journal record op {record.get('op')!r}")
        try:
            return handler(self, record, aux)
        except (KeyError, AssertionError) as exc:
            raise ValueError(f"journal record does not fit the state: {record!r}") from exc

    def _duplicate(self, binding: str, event_id: str, now: int) -> Step | None:
        r = self._receipts.get((binding, event_id))
        if r is None or now - r.at >= r.window:
            return None
        return Step(outcome=r.outcome, prior_event_id=r.prior, duplicate=True)

    def _remember(
        self, binding: str, event_id: str, outcome: str, prior: str | None, at: int
    ) -> None:
        while self._receipts:
            first = next(iter(self._receipts.values()))
            if at - first.at < first.window:
                break
            self._receipts.popitem(last=False)
        self._receipts.pop((binding, event_id), None)
        self._receipts[(binding, event_id)] = _Receipt(outcome, prior, at, self._window)
        while len(self._receipts) > self._max_receipts:
            self._receipts.popitem(last=False)

    def _mint(self) -> str:
        self._seq += 1
        return f"{self._prefix}{self._seq}"

    @staticmethod
    def _hist(slot: _Slot | None, context: str) -> History:
        if slot is None:
            return "unknown"
        return slot.hist.get(context, slot.base)

    @staticmethod
    def _summary(slot: _Slot | None) -> History:
        if slot is None or slot.base == "unknown" or "unknown" in slot.hist.values():
            return "unknown"
        return "some" if slot.hist else "none"

    @staticmethod
    def _consumed_in(slot: _Slot, context: str) -> None:
        if slot.hist.get(context, slot.base) != "unknown":
            slot.hist[context] = "some"

    def _is_rendering(self, batch: str) -> bool:
        subject = self._batches.get(batch)
        if subject is None:
            return False
        rendering = self._subjects[subject].rendering
        return rendering is not None and rendering.id == batch

    def _discarded(self, batch: str) -> Step:
        # Exactly one materialization per batch: nothing changes, nothing is journaled.
        subject = self._batches.get(batch)
        return Step(
            outcome="discarded", effects=(Audit(kind="discarded", subject=subject, batch=batch),)
        )

    def _track(self, subject: Subject, initial: bool, effects: list[Effect]) -> _Slot:
        slot = self._subjects.get(subject)
        if slot is not None:
            self._subjects.move_to_end(subject)
            return slot
        while len(self._subjects) >= self._max_subjects:
            self._evict(effects)
        slot = _Slot(base="none" if initial else "unknown")
        self._subjects[subject] = slot
        return slot

    def _evict(self, effects: list[Effect]) -> None:
        subject, slot = self._subjects.popitem(last=False)
        if slot.occupant is not None:
            self._occupants.pop(slot.occupant.occurrence, None)
            effects.append(
                Audit(kind="evicted", subject=subject, event_ids=(slot.occupant.event_id,))
            )
        for batch in (slot.rendering, slot.batch):
            if batch is not None:
                self._batches.pop(batch.id, None)
                effects.append(Audit(kind="evicted", subject=subject, batch=batch.id))
                effects.append(
                    self._materialize(subject, batch, batch.fallback, "fallback", batch.timestamp)
                )

    def _materialize(
        self,
        subject: Subject,
        batch: _Batch,
        content: tuple[Any, ...],
        source: Literal["result", "fallback"],
        timestamp: str | None,
    ) -> Materialize:
        return Materialize(
            batch=batch.id,
            occurrence=batch.id,
            subject=subject,
            contexts=batch.audience,
            content=tuple(_json(list(content))),
            source=source,
            event_id=batch.event_id,
            feature_set=batch.feature_set,
            tags=batch.tags,
            timestamp=timestamp,
            origin=batch.origin,
        )

    def _withdraw(
        self, subject: Subject, slot: _Slot, effects: list[Effect], kind: str
    ) -> str | None:
        """Remove every piece of unread work of the subject; return the newest removed eventId."""
        prior = None
        occ = slot.occupant
        if occ is not None:
            prior = occ.event_id
            effects.append(Hide(occ.occurrence, frozenset(occ.unread)))
            effects.append(Audit(kind=kind, subject=subject, event_ids=(occ.event_id,)))
            self._occupants.pop(occ.occurrence, None)
            slot.occupant = None
        if slot.rendering is not None:
            b = slot.rendering
            prior = b.event_id
            effects.append(Audit(kind="cancelled", subject=subject, batch=b.id))
            self._batches.pop(b.id, None)
            slot.rendering = None
        if slot.batch is not None:
            b = slot.batch
            prior = b.event_id
            ids = tuple(n.event_id for n in b.notices)
            effects.append(Audit(kind="superseded", subject=subject, event_ids=ids, batch=b.id))
            self._batches.pop(b.id, None)
            slot.batch = None
        return prior

    def _occupy(self, subject: Subject, slot: _Slot, occ: _Occupant) -> None:
        slot.occupant = occ
        self._occupants[occ.occurrence] = subject

    # handlers: each takes the record (and effect-only data) and returns (outcome, effects, prior)

    def _do_advertise(self, rec: Mapping[str, Any], aux: Mapping[str, Any]) -> _Applied:
        window = rec["window_ms"]
        _window(None, None, window)  # type: ignore[arg-type]
        self._window = window
        return None, [], None

    def _do_plain(self, rec: Mapping[str, Any], aux: Mapping[str, Any]) -> _Applied:
        subject = Subject.from_json(rec["subject"])
        contexts = frozenset(rec["contexts"])
        effects: list[Effect] = []
        slot = self._track(subject, rec["initial"], effects)
        unread: set[str] = set()
        delivered: set[str] = set()
        if slot.occupant is not None:
            unread |= slot.occupant.unread
            delivered |= slot.occupant.delivered
        for b in (slot.batch, slot.rendering):
            if b is not None:
                unread |= b.audience
                delivered |= b.audience
        if unread:
            prior = self._withdraw(subject, slot, effects, "displaced")
            audience = contexts & delivered
            outcome = "appended" if audience - unread else "replaced"
        else:
            audience = contexts
            if contexts:
                first = all(self._hist(slot, c) == "none" for c in contexts)
            else:
                first = self._summary(slot) == "none"
            outcome = "first" if first else "appended"
            prior = None if first else slot.last_consumed
        if audience:
            effects.append(Append(rec["occurrence"], audience))
            occ = _Occupant(rec["occurrence"], rec["event_id"], "plain", audience, set(audience))
            self._occupy(subject, slot, occ)
        self._remember(subject.binding, rec["event_id"], outcome, prior, rec["at"])
        return outcome, effects, prior

    def _do_notice(self, rec: Mapping[str, Any], aux: Mapping[str, Any]) -> _Applied:
        subject = Subject.from_json(rec["subject"])
        contexts = frozenset(rec["contexts"])
        effects: list[Effect] = []
        slot = self._track(subject, rec["initial"], effects)
        notice = _Notice(rec["event_id"], rec["timestamp"], rec.get("data", ABSENT))
        fallback = tuple(rec["fallback"])
        tags = tuple(rec["tags"])
        b = slot.batch
        prior: str | None = None
        if b is not None:
            outcome, prior = "replaced", b.event_id
            b.notices.append(notice)
            if len(b.notices) > self._max_notices:
                del b.notices[0]
                b.dropped += 1
            b.fallback, b.event_id, b.timestamp = fallback, notice.event_id, notice.timestamp
            b.tags, b.origin, b.feature_set = tags, rec["origin"], rec["feature_set"]
            b.audience &= contexts
            if not b.audience:
                effects.append(Audit(kind="narrowed", subject=subject, batch=b.id))
                self._batches.pop(b.id, None)
                slot.batch = None
        else:
            outcome, audience = "first", contexts
            occ = slot.occupant
            if occ is not None and occ.kind == "plain":
                outcome, prior = "replaced", occ.event_id
                audience = contexts & occ.delivered
                effects.append(Hide(occ.occurrence, frozenset(occ.unread)))
                effects.append(Audit(kind="displaced", subject=subject, event_ids=(occ.event_id,)))
                self._occupants.pop(occ.occurrence, None)
                slot.occupant = None
            if audience:
                batch = _Batch(
                    id=self._mint(),
                    feature_set=rec["feature_set"],
                    notices=[notice],
                    dropped=0,
                    fallback=fallback,
                    event_id=notice.event_id,
                    timestamp=notice.timestamp,
                    tags=tags,
                    origin=rec["origin"],
                    audience=audience,
                )
                slot.batch = batch
                self._batches[batch.id] = subject
        self._remember(subject.binding, rec["event_id"], outcome, prior, rec["at"])
        return outcome, effects, prior

    def _do_retract(self, rec: Mapping[str, Any], aux: Mapping[str, Any]) -> _Applied:
        subject = Subject.from_json(rec["subject"])
        contexts = frozenset(rec["contexts"])
        effects: list[Effect] = []
        slot = self._subjects.get(subject)
        prior = None
        if slot is not None:
            self._subjects.move_to_end(subject)
            prior = self._withdraw(subject, slot, effects, "withdrawn")
        reached = frozenset(c for c in contexts if self._hist(slot, c) != "none")
        seen = bool(reached) if contexts else self._summary(slot) != "none"
        if not seen:
            outcome = "retracted"
        elif rec["notice"]:
            outcome = "noted"
            if reached:
                effects.append(Append(rec["occurrence"], reached))
        else:
            outcome = "consumed"
        if prior is None and seen and slot is not None:
            prior = slot.last_consumed
        self._remember(subject.binding, rec["event_id"], outcome, prior, rec["at"])
        return outcome, effects, prior

    def _do_begin(self, rec: Mapping[str, Any], aux: Mapping[str, Any]) -> _Applied:
        effects: list[Effect] = []
        for batch_id in rec["render"]:
            subject = self._batches[batch_id]
            slot = self._subjects[subject]
            b = slot.batch
            assert b is not None and b.id == batch_id and slot.rendering is None
            slot.batch, slot.rendering, b.context = None, b, rec["context"]
            self._subjects.move_to_end(subject)
            effects.append(RequestRender(batch_id, subject, self._params(subject, b)))
        for batch_id in rec["drop"]:
            subject = self._batches.pop(batch_id)
            slot = self._subjects[subject]
            assert slot.batch is not None and slot.batch.id == batch_id
            slot.batch = None
            self._subjects.move_to_end(subject)
            effects.append(Audit(kind="dropped", subject=subject, batch=batch_id))
        return None, effects, None

    @staticmethod
    def _params(subject: Subject, b: _Batch) -> dict[str, Any]:
        params: dict[str, Any] = {"featureSet": b.feature_set}
        if subject.scope_kind == "channel":
            params["channelId"] = subject.scope_id
        params.update(
            key=subject.key,
            eventId=b.event_id,
            notices=[n.wire() for n in b.notices],
            dropped=b.dropped,
        )
        out: dict[str, Any] = _json(params)
        return out

    def _close(self, rec: Mapping[str, Any]) -> tuple[Subject, _Slot, _Batch]:
        subject = self._batches.pop(rec["batch"])
        slot = self._subjects[subject]
        b = slot.rendering
        assert b is not None and b.id == rec["batch"]
        slot.rendering = None
        self._subjects.move_to_end(subject)
        return subject, slot, b

    def _settle(
        self,
        subject: Subject,
        slot: _Slot,
        b: _Batch,
        content: tuple[Any, ...],
        source: Literal["result", "fallback"],
        timestamp: str | None,
    ) -> list[Effect]:
        effects: list[Effect] = []
        old = slot.occupant
        if old is not None:
            # An older rendered delta nobody has read yet: keep it, as history (its span is
            # the new one's baseline), and stop treating the subject as known.
            for c in old.unread:
                slot.hist[c] = "unknown"
            self._occupants.pop(old.occurrence, None)
            slot.occupant = None
            effects.append(Audit(kind="sealed", subject=subject, event_ids=(old.event_id,)))
        effects.append(self._materialize(subject, b, content, source, timestamp))
        occ = _Occupant(b.id, b.event_id, "materialized", b.audience, set(b.audience))
        self._occupy(subject, slot, occ)
        return effects

    def _do_rendered(self, rec: Mapping[str, Any], aux: Mapping[str, Any]) -> _Applied:
        subject, slot, b = self._close(rec)
        if rec["empty"]:
            return "empty", [Audit(kind="empty", subject=subject, batch=b.id)], None
        content = aux.get("content", ())
        return (
            "materialized",
            self._settle(subject, slot, b, content, "result", aux.get("timestamp")),
            None,
        )

    def _do_failed(self, rec: Mapping[str, Any], aux: Mapping[str, Any]) -> _Applied:
        if rec["reason"] not in FAILURE_REASONS:
            raise ValueError(f"unknown render failure {rec['reason']!r}")
        subject, slot, b = self._close(rec)
        return "fallback", self._settle(subject, slot, b, b.fallback, "fallback", b.timestamp), None

    def _do_lapsed(self, rec: Mapping[str, Any], aux: Mapping[str, Any]) -> _Applied:
        subject, _slot, b = self._close(rec)
        return "dropped", [Audit(kind="dropped", subject=subject, batch=b.id)], None

    def _do_assembled(self, rec: Mapping[str, Any], aux: Mapping[str, Any]) -> _Applied:
        context = rec["context"]
        for occurrence in rec["occurrences"]:
            subject = self._occupants[occurrence]
            slot = self._subjects[subject]
            occ = slot.occupant
            assert occ is not None and occ.occurrence == occurrence
            self._subjects.move_to_end(subject)
            slot.last_consumed = occ.event_id
            if occ.kind == "materialized":
                # Shared render baseline: consumed anywhere, preserved everywhere.
                for c in occ.delivered:
                    self._consumed_in(slot, c)
                occ.unread.clear()
            else:
                self._consumed_in(slot, context)
                occ.unread.discard(context)
            if not occ.unread:
                del self._occupants[occurrence]
                slot.occupant = None
        return None, [], None

    def _do_recover(self, rec: Mapping[str, Any], aux: Mapping[str, Any]) -> _Applied:
        effects: list[Effect] = []
        for subject, slot in self._subjects.items():
            sealed = False
            if slot.occupant is not None:
                occ = slot.occupant
                self._occupants.pop(occ.occurrence, None)
                slot.occupant = None
                effects.append(Audit(kind="sealed", subject=subject, event_ids=(occ.event_id,)))
                sealed = True
            if slot.rendering is not None:
                b = slot.rendering
                self._batches.pop(b.id, None)
                slot.rendering = None
                effects.append(self._materialize(subject, b, b.fallback, "fallback", b.timestamp))
                sealed = True
            if sealed or rec["history_lost"]:
                slot.base = "unknown"
                slot.hist.clear()
        return None, effects, None

    def _do_snapshot(self, rec: Mapping[str, Any], aux: Mapping[str, Any]) -> _Applied:
        self._load(rec["state"])
        return None, [], None

    # ---------------------------------------------------------------- snapshot codec

    def _state(self) -> dict[str, Any]:
        def batch(b: _Batch | None) -> dict[str, Any] | None:
            if b is None:
                return None
            return {
                "id": b.id,
                "feature_set": b.feature_set,
                "notices": [n.wire() for n in b.notices],
                "dropped": b.dropped,
                "fallback": list(b.fallback),
                "event_id": b.event_id,
                "timestamp": b.timestamp,
                "tags": list(b.tags),
                "origin": b.origin,
                "audience": sorted(b.audience),
                "context": b.context,
            }

        subjects = []
        for subject, slot in self._subjects.items():
            occ = slot.occupant
            subjects.append(
                {
                    "subject": subject.to_json(),
                    "base": slot.base,
                    "hist": dict(sorted(slot.hist.items())),
                    "occupant": None
                    if occ is None
                    else {
                        "occurrence": occ.occurrence,
                        "event_id": occ.event_id,
                        "kind": occ.kind,
                        "delivered": sorted(occ.delivered),
                        "unread": sorted(occ.unread),
                    },
                    "batch": batch(slot.batch),
                    "rendering": batch(slot.rendering),
                    "last_consumed": slot.last_consumed,
                }
            )
        receipts = [
            [binding, event_id, r.outcome, r.prior, r.at, r.window]
            for (binding, event_id), r in self._receipts.items()
        ]
        return _json_object(
            {
                "seq": self._seq,
                "window_ms": self._window,
                "subjects": subjects,
                "receipts": receipts,
            }
        )

    def _load(self, state: Mapping[str, Any]) -> None:
        def batch(raw: Mapping[str, Any] | None) -> _Batch | None:
            if raw is None:
                return None
            return _Batch(
                id=raw["id"],
                feature_set=raw["feature_set"],
                notices=[
                    _Notice(n["eventId"], n["timestamp"], n.get("data", ABSENT))
                    for n in raw["notices"]
                ],
                dropped=raw["dropped"],
                fallback=tuple(raw["fallback"]),
                event_id=raw["event_id"],
                timestamp=raw["timestamp"],
                tags=tuple(raw["tags"]),
                origin=raw["origin"],
                audience=frozenset(raw["audience"]),
                context=raw["context"],
            )

        self._seq = state["seq"]
        self._window = state["window_ms"]
        self._subjects = OrderedDict()
        self._occupants = {}
        self._batches = {}
        for raw in state["subjects"]:
            subject = Subject.from_json(raw["subject"])
            occ_raw = raw["occupant"]
            slot = _Slot(
                base=raw["base"],
                hist=dict(raw["hist"]),
                batch=batch(raw["batch"]),
                rendering=batch(raw["rendering"]),
                last_consumed=raw["last_consumed"],
            )
            if occ_raw is not None:
                occ = _Occupant(
                    occ_raw["occurrence"],
                    occ_raw["event_id"],
                    occ_raw["kind"],
                    frozenset(occ_raw["delivered"]),
                    set(occ_raw["unread"]),
                )
                self._occupy(subject, slot, occ)
            for b in (slot.batch, slot.rendering):
                if b is not None:
                    self._batches[b.id] = subject
            self._subjects[subject] = slot
        self._receipts = OrderedDict(
            ((binding, event_id), _Receipt(outcome, prior, at, window))
            for binding, event_id, outcome, prior, at, window in state["receipts"]
        )


_Handler: TypeAlias = Callable[[Coalescer, Mapping[str, Any], Mapping[str, Any]], _Applied]
_HANDLERS: Final[dict[str, _Handler]] = {
    "advertise": Coalescer._do_advertise,
    "plain": Coalescer._do_plain,
    "notice": Coalescer._do_notice,
    "retract": Coalescer._do_retract,
    "begin": Coalescer._do_begin,
    "rendered": Coalescer._do_rendered,
    "failed": Coalescer._do_failed,
    "lapsed": Coalescer._do_lapsed,
    "assembled": Coalescer._do_assembled,
    "recover": Coalescer._do_recover,
    "snapshot": Coalescer._do_snapshot,
}
