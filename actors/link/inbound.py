"""The hot lanes of a connection: ``push/event`` and ``channels/incoming``.

``HotLanes.prepare`` admits and converts a batch of such requests and hands their items to their
channels (one ask per channel, items in arrival order); the channels hand back their writes and
they all go to the store in one piece (one transaction, however many channels the batch spans),
except that a channel with coalesced items (RFC-006) writes its own, after what came before it.
``HotLanes.responder`` answers them once their writes are committed (a batch of replies per write),
traces each new item and wakes the agents, one message per agent per batch. What the host refuses
(a whole request, or one message of a batch) is traced as ``refused``; items the store already held
(a replay) are counted and reported as ``duplicates-skipped`` by a ``SkipTally``: the first at
once, later ones summed per ``SKIP_REPORT_S``, the rest when the link ends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio

from actors.messages import IngestBatch, Prepared, Wake, Wakes
from protocol import jsonrpc as rpc
from protocol.authors import origin_author
from protocol.coalesce import CoalesceInvalid, CoalesceSpec, parse_coalesce
from protocol.errors import (
    CHANNEL_NOT_PERMITTED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    UNKNOWN_CHANNEL,
    RpcError,
)
from protocol.lanes import (
    IncomingMessage,
    PushEvent,
    native_channel,
    parse_incoming,
    parse_incoming_batch,
    parse_push,
)
from protocol.mcpl import HOST_COALESCING
from store import StoreError

from .handshake import note_refused_use
from .state import (
    INGEST_SLICE,
    TAKE_LIMIT,
    Link,
    LinkOwner,
    Trace,
    admit,
    as_rpc_error,
    refusal_reason,
    utc_now,
)
from .tally import SkipTally

SKIP_REPORT_S = 10.0  # at most one "already-stored items skipped" line per server this often


class Pending:
    """A hot-lane request whose items were handed to the store: its id and method, (prepared
    item, trace fields), what was refused item by item, and the error that answers the whole
    request, if any. The request itself (its decoded params) is not kept past conversion."""

    __slots__ = ("error", "id", "items", "method", "push", "refused", "why")

    def __init__(self, req: rpc.Request) -> None:
        self.id = req.id
        self.method = req.method
        self.push = req.method == "push/event"
        self.items: list[tuple[Prepared, Trace]] = []
        self.refused: list[dict[str, Any]] | None = None  # made by the first refusal
        self.why: list[tuple[str, str | None]] = []  # (reason for the transcript, channel id)
        self.error: RpcError | None = None

    def refuse(
        self,
        message_id: Any,
        reason: str,
        *,
        detail: str | None = None,
        channel_id: str | None = None,
    ) -> None:
        """One message of a ``channels/incoming`` request is refused: ``reason`` goes to the
        server, ``detail`` (if any) to the transcript after it."""
        if self.refused is None:
            self.refused = []
        self.refused.append({"messageId": message_id, "accepted": False, "reason": reason})
        self.why.append((f"{reason}: {detail}" if detail else reason, channel_id))


class HotLanes:
    def __init__(self, owner: LinkOwner) -> None:
        self.owner = owner
        self.skips = SkipTally(SKIP_REPORT_S)
        self._skips_due = trio.Event()  # set when a sum starts waiting for its report

    # -- admission and conversion ---------------------------------------------------------------
    async def prepare(self, link: Link, requests: list[rpc.Request]) -> list[Pending]:
        """Admit and convert a batch of hot-lane requests, then hand their items to their
        channels: one ask per channel, items in arrival order. The answers wait for the commit.

        ``requests`` is emptied once they are parsed: their decoded params are not kept alive
        while the channels convert and the writes commit."""
        owner = self.owner
        accepted_at = utc_now()  # one timestamp for what was read together
        # a server with a backlog is flooding: while others need the host too, its writes may
        # gather in the store (bulk); alone, its own messages are what agents wait for
        bulk = len(link.requests) >= INGEST_SLICE and owner.ctx.contended(owner.sid)
        out = [Pending(req) for req in requests]
        groups: dict[str | None, list[tuple[Pending, Any, Any, Trace]]] = {}
        admitted: set[tuple[str, str | None]] = set()  # the link does not change meanwhile
        for req, pending in zip(requests, out, strict=True):
            try:
                params = req.params
                if type(params) is not dict and not isinstance(params, Mapping):
                    params = {}
                feature_set = params.get("featureSet")
                if not (feature_set is None or type(feature_set) is str):
                    admit(link, req.method, feature_set)
                elif (req.method, feature_set) not in admitted:
                    admit(link, req.method, feature_set)
                    admitted.add((req.method, feature_set))
                parsed: Sequence[tuple[str | None, Any, Any, Trace]]
                if pending.push:
                    parsed = [self.parse_push(link, req.params)]
                else:
                    parsed = self.parse_incoming(link, req.params, pending)
                for channel_id, item, spec, trace in parsed:
                    groups.setdefault(channel_id, []).append((pending, item, spec, trace))
            except Exception as exc:
                pending.error = as_rpc_error(exc, req.method)
        requests.clear()
        timeout = owner.cfg.request_timeout_s
        unwritten: list[tuple[Pending, Prepared, Trace]] = []  # in order, for one write
        for cid, entries in groups.items():
            specs = tuple([spec for _, _, spec, _ in entries])
            coalesced = any(spec is not None for spec in specs)
            if coalesced:  # its writes go after those of the channels before it
                await self._write(unwritten, bulk)
            try:
                chan = await owner.ctx.channel(owner.sid, cid)
                results = await chan.ask(
                    IngestBatch(
                        items=tuple([item for _, item, _, _ in entries]),
                        specs=specs,
                        accepted_at=accepted_at,
                        write=coalesced,
                    ),
                    timeout=timeout,
                )
            except Exception as exc:
                results = [as_rpc_error(exc, "ingest")] * len(entries)
            for (pending, _, _, trace), result in zip(entries, results, strict=True):
                if isinstance(result, Prepared) and result.op is not None:
                    unwritten.append((pending, result, trace))
                elif isinstance(result, Prepared):
                    pending.items.append((result, trace))
                else:
                    _refuse(pending, trace, result)
        await self._write(unwritten, bulk)
        return out

    async def _write(self, unwritten: list[tuple[Pending, Prepared, Trace]], bulk: bool) -> None:
        """Hand the channels' writes to the store in one piece, in order, and give each item
        its pending write (emptying ``unwritten``); ``bulk`` writes may gather a little in the
        store (:mod:`actors.store_writer`)."""
        if not unwritten:
            return
        try:
            futures = await self.owner.ctx.store.submit_many(
                [p.op for _, p, _ in unwritten], bulk=bulk
            )
        except Exception as exc:
            error = as_rpc_error(exc, "ingest")
            for pending, _, trace in unwritten:
                _refuse(pending, trace, error)
        else:
            for (pending, prepared, trace), future in zip(unwritten, futures, strict=True):
                pending.items.append((attrs.evolve(prepared, future=future, op=None), trace))
        unwritten.clear()

    def parse_push(
        self, link: Link, params: Any
    ) -> tuple[str | None, PushEvent, CoalesceSpec | None, Trace]:
        event = parse_push(params)  # admission already checked its feature set
        scoped = None
        claimed = (event.origin or {}).get("mcplChannelId")
        if isinstance(claimed, str) and claimed in link.channels:
            scoped = claimed
        elif claimed is None:  # named only by the server's own id, matched when unambiguous
            scoped = native_channel(event.origin, link.channels)
        spec = None
        if event.coalesce is not None:
            spec = self.coalesce_spec(link, event)
            if spec.channel_id is not None:
                scoped = spec.channel_id  # channel scope is only ever named, never inferred
        pushed_by = origin_author(event.origin)
        author = pushed_by.name or pushed_by.id if pushed_by is not None else None
        return scoped, event, spec, ("push", scoped, event.event_id, author)

    @staticmethod
    def coalesce_spec(link: Link, event: PushEvent) -> CoalesceSpec:
        """A push's valid ``coalesce`` member (RFC-006), or the error refusing the push; a
        channel-scoped one must name a channel this server registered, with
        ``channels.incoming`` granted."""
        parsed = parse_coalesce(
            event.coalesce, lane="push", advertised=HOST_COALESCING, event_id=event.event_id
        )
        if isinstance(parsed, CoalesceInvalid):
            raise RpcError(
                code=INVALID_PARAMS,
                message=f"Invalid params: {parsed.field}: {parsed.reason}",
                data=parsed.error_data(),
            )
        cid = parsed.channel_id
        if cid is not None and cid not in link.channels:
            raise RpcError(code=UNKNOWN_CHANNEL, message="Unknown channel", data={"channelId": cid})
        if cid is not None and "channels.incoming" not in link.grant:
            raise RpcError(
                code=CHANNEL_NOT_PERMITTED,
                message="channels.incoming is not granted",
                data={"channelId": cid},
            )
        return parsed

    @staticmethod
    def parse_incoming(
        link: Link, params: Any, pending: Pending
    ) -> list[tuple[str, IncomingMessage, CoalesceSpec | None, Trace]]:
        items = []
        for raw in parse_incoming_batch(params):
            try:
                msg = parse_incoming(raw)
            except RpcError as exc:
                pending.refuse(
                    raw.get("messageId") if isinstance(raw, Mapping) else None, exc.message
                )
                continue
            spec = None
            if msg.coalesce is not None:
                parsed = parse_coalesce(
                    msg.coalesce, lane="incoming", advertised=HOST_COALESCING, event_id=msg.event_id
                )
                if isinstance(parsed, CoalesceInvalid):
                    detail = f"{parsed.field} {parsed.reason}"
                    pending.refuse(
                        msg.message_id, "coalesce_invalid", detail=detail, channel_id=msg.channel_id
                    )
                    continue
                spec = parsed
            if msg.channel_id not in link.channels:
                pending.refuse(
                    msg.message_id,
                    "unknown_channel",
                    detail="the channel is not registered",
                    channel_id=msg.channel_id,
                )
                continue
            author = msg.author.name or msg.author.id
            trace: Trace = ("incoming", msg.channel_id, msg.message_id, author)
            items.append((msg.channel_id, msg, spec, trace))
        return items

    # -- answers --------------------------------------------------------------------------------
    async def responder(self, link: Link) -> None:
        """Answer the hot lanes in commit order (the store commits FIFO), a batch per write,
        then trace and wake: one wake per agent per batch, naming the newest conversation."""
        owner = self.owner
        while True:
            answers = await link.answers.take(owner.ctx.ingest_slice(owner.sid, TAKE_LIMIT))
            try:
                lines: list[str] = []
                done: list[tuple[Prepared, Trace]] = []
                skipped = 0
                for pending in answers:  # most commit together: wait for the stragglers
                    for prepared, _ in pending.items:
                        if not prepared.future.done:
                            await prepared.future.wait_settled()
                for pending in answers:
                    line, dropped = self.answer_line(link, pending, done)
                    skipped += dropped
                    if line is not None:
                        lines.append(line)
                await owner.send_lines(link, lines)
                self.count_skips(skipped)
                # one message per agent, carrying each item's own wake: the gate and the
                # speech route look at every one of them
                wakes: dict[str, list[Wake]] = {}
                publish, sid = owner.ctx.trace.publish_fields, owner.sid
                vitals = owner.ctx.vitals.get(sid)
                for prepared, (kind, channel_id, key, author) in done:
                    if vitals is not None:
                        vitals.stored(channel_id)
                    text = _text(prepared.blocks)
                    fields: dict[str, Any] = (
                        {"event_id": key, "author": author, "text": text}
                        if kind == "push"
                        else {"message_id": key, "author": author, "text": text}
                    )
                    publish(kind, sid, channel_id, fields)
                    for agent, wake in prepared.wakes:
                        wakes.setdefault(agent, []).append(wake)
                fleet = owner.ctx.fleet
                for agent, items in wakes.items():
                    ref = owner.ctx.agents.get(agent)
                    if ref is not None:  # every agent in this step (the take checkpoints)
                        await ref.tell_promptly(Wakes(items=tuple(items)))
                    elif fleet is not None:  # it runs on another host: woken from there
                        fleet.wake_elsewhere(agent, items)
            finally:
                owner.work.dec(len(answers))
                in_flight = owner.ctx.hot_in_flight
                in_flight[owner.sid] = max(0, in_flight.get(owner.sid, 0) - len(answers))

    def answer_line(
        self, link: Link, pending: Pending, done: list[tuple[Prepared, Trace]]
    ) -> tuple[str | None, int]:
        """The reply to a request whose writes are all settled (None if the link is gone), and
        how many of its items the store already held. Items that were new are added to
        ``done``; every refusal the reply carries is traced."""
        results: list[dict[str, Any]] = []
        all_ok = pending.error is None
        skipped = 0
        failed: list[Trace] = []
        for prepared, trace in pending.items:
            ok = True
            try:
                if prepared.future.result().stored:
                    done.append((prepared, trace))
                elif prepared.coalesce is None:  # a coalesced item reports its own outcome
                    skipped += 1
            except StoreError as exc:
                self.owner.trace("error", error=f"store failed: {exc}", method=pending.method)
                ok = all_ok = False
                failed.append(trace)
            if not pending.push:
                entry: dict[str, Any] = {"messageId": trace[2], "accepted": ok}
                if not ok:
                    entry["reason"] = "not stored; retry"
                elif prepared.coalesce is not None:
                    entry["coalesce"] = dict(prepared.coalesce)
                results.append(entry)
        error = pending.error
        try:
            if error is not None:
                line = link.session.send_error(pending.id, error)
            elif not pending.push:
                if pending.refused:
                    results += pending.refused
                line = link.session.send_response(pending.id, {"results": results})
            elif all_ok:
                answer: dict[str, Any] = {"accepted": True}
                for prepared, _ in pending.items:
                    if prepared.coalesce is not None:
                        answer["coalesce"] = dict(prepared.coalesce)
                line = link.session.send_response(pending.id, answer)
            else:
                error = RpcError(code=INTERNAL_ERROR, message="not stored; retry")
                line = link.session.send_error(pending.id, error)
        except rpc.LocalProtocolError:
            return None, 0  # the session closed meanwhile; the server retries on a new link
        self._trace_refusals(pending, error, failed)
        note_refused_use(self.owner, link, pending.method, error)
        return line, skipped

    def _trace_refusals(
        self, pending: Pending, error: RpcError | None, failed: list[Trace]
    ) -> None:
        refused, method = self.owner.refused, pending.method
        if error is not None:
            refused(method, error, refusal_reason(error), request_id=pending.id)
            return
        for _, channel_id, message_id, _ in failed:
            refused(method, None, "not stored; retry", channel_id=channel_id, message_id=message_id)
        for entry, (reason, channel_id) in zip(pending.refused or (), pending.why, strict=True):
            refused(method, None, reason, channel_id=channel_id, message_id=entry["messageId"])

    # -- duplicates ----------------------------------------------------------------------------
    def count_skips(self, n: int) -> None:
        now_report = self.skips.add(n, trio.current_time())
        if now_report:
            self._report_skips(now_report)
        elif self.skips.pending:
            self._skips_due.set()

    async def skip_reporter(self) -> None:
        """Report a pending sum of skips when its interval ends (runs as long as the link)."""
        while True:
            due = self.skips.due_at()
            if due is None:
                self._skips_due = trio.Event()
                await self._skips_due.wait()
                continue
            await trio.sleep_until(due)
            self._report_skips(self.skips.take(trio.current_time()))

    def flush_skips(self) -> None:
        """The link ended: whatever is still counted is reported now."""
        self._report_skips(self.skips.flush(trio.current_time()))

    def _report_skips(self, n: int) -> None:
        if n:
            self.owner.trace("duplicates-skipped", count=n)


def _refuse(pending: Pending, trace: Trace, error: Any) -> None:
    """One item of ``pending`` was refused with ``error``: the whole request for a push."""
    if pending.push:
        pending.error = error
    else:
        text = error.message if isinstance(error, RpcError) else str(error)
        pending.refuse(trace[2], text, channel_id=trace[1])


def _text(blocks: Any) -> str:
    return "\n".join([str(b.get("text", "")) for b in blocks if b.get("type") == "text"])
