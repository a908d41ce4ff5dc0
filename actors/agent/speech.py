"""An agent's speech: where its prose goes, how it is sent, and what it is told afterwards.

* :class:`SpeechSender` is one agent's outgoing queue: one FIFO per channel, each served by a
  task of the agent's own nursery (not the turn's), so an aborted turn's speech still settles,
  and only that agent waits for it (its next turn is parked until the queue is empty).
* :class:`TurnSpeech` is one turn's speech: the route decided from the wake, the pin a prefix
  sets, the segments of each round sent or kept as drafts, the streamed chunks, the typing
  indicator, and at the end the notices and the ``[delivered]`` receipt.
* :class:`Drafts` holds the agent's kept prose, saved in the store's state table.
"""

from __future__ import annotations

import itertools
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from actors.context import HostContext
from actors.link.calls import notify
from actors.messages import Publish
from protocol.conversation import conversation_id
from protocol.leases import agent_resource
from protocol.prose import (
    SKIP,
    ChannelView,
    ProseStreamRouter,
    TargetError,
    resolve_target,
    split_segments,
    target_token,
)
from protocol.receipts import (
    Delivery,
    DraftView,
    Place,
    bounce_notice,
    delivered_receipt,
    hold_notice,
    target_error_notice,
    unroutable_notice,
)
from protocol.routes import (
    LEGACY,
    Candidate,
    Hold,
    PublishOutcome,
    Route,
    Unroutable,
    place_problem,
    suspends,
)
from store import PutState

#: What a publish the host's stop cut short says: it may or may not have landed.
CUT_SHORT = "the publish was cut short: the host is stopping"
#: What a segment still queued when the host stopped says.
NOT_SENT_STOPPING = "not sent: the host is stopping"
#: Why a post was not sent by a host whose lease of the agent is due to stop (a fleet).
LEASE_LAPSED = "not sent: this host's lease of the agent lapsed"
#: Unsettled segments one agent may have queued; past it a segment is kept as a draft.
MAX_SPEECH_QUEUE = 256
#: Drafts kept per agent; the oldest are forgotten first.
MAX_DRAFTS = 200
DRAFTS_NS = "drafts"
#: Notices one turn stores (unknown targets and the like); past it they are only counted.
MAX_TURN_NOTICES = 16
#: How often a typing indicator is renewed while a turn runs (chat typing lasts ~10 s).
TYPING_REFRESH_S = 7.0
PUBLISH_ASK_MARGIN_S = 10.0
#: Rounds whose prose is kept as drafts instead of published: the agent chose to say nothing,
#: or to say it through a tool.
SILENCING_TOOLS = frozenset({"skip_reply", "think", "channel_publish"})


def new_key() -> str:
    """A fresh idempotency key for a post no turn owns."""
    return uuid.uuid4().hex


def place_of(view: ChannelView, thread_id: str | None = None) -> Place:
    return Place(
        server_id=view.server_id, channel_id=view.channel_id, label=view.label, thread_id=thread_id
    )


async def publish(
    ctx: HostContext,
    agent: str,
    place: Place,
    text: str,
    *,
    key: str | None = None,
    prose: bool = False,
) -> tuple[PublishOutcome, Any]:
    """Publish ``text`` to ``place`` through its channel actor (on a fleet, through the
    outbox when another host holds the server's connection); never raises for a refusal."""
    fleet = ctx.fleet
    if fleet is not None:
        if not fleet.may_act(agent_resource(agent)):  # the agent's lease is going: say nothing
            return PublishOutcome(status="failed", reason=LEASE_LAPSED), None
        if place.server_id not in ctx.connections and fleet.outbox is not None:
            blocks = ({"type": "text", "text": text},)
            outcome: tuple[PublishOutcome, Any] = await fleet.outbox.publish(
                agent, place, blocks, key or new_key(), prose
            )
            return outcome
    try:
        ref = await ctx.channel(place.server_id, place.channel_id)
        answer: tuple[PublishOutcome, Any] = await ref.ask(
            Publish(
                agent=agent,
                blocks=({"type": "text", "text": text},),
                thread_id=place.thread_id,
                key=key,
                prose=prose,
            ),
            timeout=ctx.config.request_timeout(place.server_id) + PUBLISH_ASK_MARGIN_S,
        )
        return answer
    except TimeoutError as exc:
        return PublishOutcome(status="unconfirmed", reason=str(exc)), None
    except Exception as exc:
        if ctx.closing:  # whatever the stop broke on the way, it is the stop that counts
            return PublishOutcome(status="unconfirmed", reason=CUT_SHORT), None
        return PublishOutcome(status="failed", reason=str(exc) or type(exc).__name__), None


async def channel_views(
    ctx: HostContext, servers: Sequence[str]
) -> tuple[list[ChannelView], dict[tuple[str, str], str | None]]:
    """The channels an agent hears, for resolving targets, and each one's declared place (read
    from the host's channel directory, without an ask per channel)."""
    return ctx.channel_directory.views(servers, ctx.config)


@attrs.define(eq=False)
class Ticket:
    """One segment queued for publishing."""

    place: Place
    text: str
    key: str
    prose: bool = True
    done: trio.Event = attrs.field(factory=trio.Event)
    outcome: PublishOutcome | None = None


class SpeechSender:
    """One agent's outgoing speech: FIFO per channel; ``unsettled`` counts what is queued or
    being sent, and ``on_settled`` runs each time it drops to zero. ``on_send(place, text)``
    is told each post just before it is sent."""

    def __init__(
        self,
        ctx: HostContext,
        agent: str,
        spawn: Callable[..., None],
        on_settled: Callable[[], None],
        trace: Callable[..., None],
        on_send: Callable[[Place, str], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.agent = agent
        self._spawn = spawn
        self._on_settled = on_settled
        self._trace = trace
        self._on_send = on_send
        self._queues: dict[tuple[str, str], deque[Ticket]] = {}
        self.unsettled = 0

    def send(self, ticket: Ticket) -> bool:
        """Queue ``ticket``; False (nothing queued) when the agent's queue is full."""
        if self.unsettled >= MAX_SPEECH_QUEUE:
            return False
        self.unsettled += 1
        key = (ticket.place.server_id, ticket.place.channel_id)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
            queue.append(ticket)
            self._spawn(self._serve, key)
        else:
            queue.append(ticket)
        return True

    async def _serve(self, key: tuple[str, str]) -> None:
        queue = self._queues[key]
        try:
            while queue:
                ticket = queue[0]
                raw: Any = None
                try:
                    if self._on_send is not None:
                        self._on_send(ticket.place, ticket.text)
                    ticket.outcome, raw = await publish(
                        self.ctx,
                        self.agent,
                        ticket.place,
                        ticket.text,
                        key=ticket.key,
                        prose=ticket.prose,
                    )
                except trio.Cancelled:
                    if self.ctx.closing:  # sent, but its answer will never be read
                        ticket.outcome = PublishOutcome(status="unconfirmed", reason=CUT_SHORT)
                    raise
                finally:
                    if ticket.outcome is not None:
                        self._trace(
                            "published",
                            ticket.place,
                            text=ticket.text,
                            outcome=ticket.outcome.status,
                            reason=ticket.outcome.reason,
                            receipt=dict(raw) if isinstance(raw, Mapping) else {},
                        )
                    queue.popleft()
                    ticket.done.set()
                    self.unsettled -= 1
        finally:
            for ticket in queue:  # cancelled (the host is stopping): nothing more is sent
                if self.ctx.closing:
                    ticket.outcome = PublishOutcome(status="failed", reason=NOT_SENT_STOPPING)
                ticket.done.set()
            self.unsettled -= len(queue)
            queue.clear()
            del self._queues[key]
            if self.unsettled == 0:
                self._on_settled()


@attrs.define
class Draft:
    id: str
    text: str
    reason: str
    place: Place | None = None

    def to_state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "text": self.text, "reason": self.reason}
        if self.place is not None:
            out["place"] = attrs.asdict(self.place)
        return out

    @classmethod
    def from_state(cls, raw: Any) -> Draft | None:
        if not isinstance(raw, Mapping):
            return None
        try:
            place = raw.get("place")
            return cls(
                id=str(raw["id"]),
                text=str(raw["text"]),
                reason=str(raw.get("reason", "")),
                place=Place(**place) if isinstance(place, Mapping) else None,
            )
        except (KeyError, TypeError):
            return None

    def view(self) -> DraftView:
        return DraftView(id=self.id, text=self.text, reason=self.reason, destination=self.place)


class Drafts:
    """An agent's drafts (at most ``MAX_DRAFTS``; the oldest forgotten first), with ids that
    never repeat; saved in the store's state table under ``drafts/<agent>``."""

    def __init__(self, ctx: HostContext, agent: str) -> None:
        self.ctx = ctx
        self.agent = agent
        self.items: dict[str, Draft] = {}
        self.next = 1
        self.forgotten = 0
        self.in_flight: set[str] = set()  # being resent: not dismissed meanwhile
        self._saved: Any = None  # the state last read or written

    async def load(self) -> None:
        saved = await self.ctx.store.read(self.ctx.store.reader.state, DRAFTS_NS)
        raw = saved.get(self.agent)
        if isinstance(raw, Mapping):
            self._restore(raw)
        self._saved = self.state()  # as good as saved: nothing to write until it changes

    def _restore(self, raw: Mapping[str, Any]) -> None:
        nxt = raw.get("next")
        self.next = nxt if isinstance(nxt, int) and nxt > 0 else 1
        for item in raw.get("items", ()) if isinstance(raw.get("items"), list) else ():
            draft = Draft.from_state(item)
            if draft is not None:
                self.items[draft.id] = draft

    def add(self, text: str, reason: str, place: Place | None = None) -> str:
        draft_id = f"d{self.next}"
        self.next += 1
        self.items[draft_id] = Draft(id=draft_id, text=text, reason=reason, place=place)
        while len(self.items) > MAX_DRAFTS:
            oldest = next(iter(self.items))
            del self.items[oldest]
            self.forgotten += 1
        return draft_id

    def state(self) -> dict[str, Any]:
        return {"next": self.next, "items": [d.to_state() for d in self.items.values()]}

    def save_op(self) -> PutState | None:
        """The write that saves the drafts, or None when they are saved as they are; call
        :meth:`saved` once it is committed."""
        value = self.state()
        if value == self._saved:
            return None
        return self.ctx.agent_fenced(
            self.agent, PutState(namespace=DRAFTS_NS, key=self.agent, value=value)
        )

    def saved(self, op: PutState) -> None:
        self._saved = op.value

    async def save(self) -> None:
        op = self.save_op()
        if op is not None:
            await self.ctx.store.write(op)
            self.saved(op)


@attrs.define
class Destination:
    """Where one segment goes: a place, or why it is kept instead."""

    place: Place | None = None
    kept: str | None = None  # the draft reason; None when it is sent
    prose: bool = True
    operator: bool = False  # it answers the operator's local input (shown, not published)


class TurnSpeech:
    """The speech of one turn. ``submit`` decides each segment's destination at once (in the
    order written), queues what is sent and keeps the rest as drafts; ``settle`` waits for the
    turn's segments and stores the notices and the receipt."""

    def __init__(
        self,
        *,
        ctx: HostContext,
        agent: str,
        mode: str,
        decision: Route | Hold | Unroutable | None,
        channels: list[ChannelView],
        places: Mapping[tuple[str, str], str | None],
        inference_id: str,
        sender: SpeechSender,
        drafts: Drafts,
        trace: Callable[..., None],
        local: bool = False,
    ) -> None:
        self.ctx = ctx
        self.agent = agent
        self.mode = mode
        self.decision = decision
        self.route: Route | None = decision if isinstance(decision, Route) else None
        self.channels = channels
        self.places = dict(places)
        self.inference_id = inference_id
        self.sender = sender
        self.drafts = drafts
        self._trace = trace
        # the operator's local input woke the turn: with no channel to answer, prose answers them
        self.local = local
        self.answered = 0  # segments that answered the operator
        self.pin: Place | None = None
        self.suspended = False
        self.engaged: set[tuple[str, str]] = set()
        self.tickets: list[Ticket] = []
        self.kept: list[tuple[str, str]] = []  # (draft id, reason)
        self.suppressed = 0
        self.notices: list[str] = []
        self.notices_dropped = 0
        self._keys = itertools.count(1)
        self.rewake = False  # a segment asked for another turn right after this one (" !")
        self._route_told = False  # the agent was told that the route's place takes no prose
        self._unroutable_kept = False  # prose was kept because the woken place takes none
        # streaming: the round's router, the pin as the stream has seen it, one chunk counter
        self._router: ProseStreamRouter | None = None
        self._stream_pin: Place | None = None
        self._chunk_index = 0
        self._streamed: dict[tuple[str, str], Place] = {}

    # -- places --------------------------------------------------------------------------
    def route_place(self) -> Place | None:
        route = self.route
        if route is None:
            return None
        return self._place((route.server_id, route.channel_id, route.thread_id))

    def explicit_place(self) -> Place | str:
        """Where an explicit post that names no channel goes (``channel_publish`` without
        ``channel_id``): the pinned place, the route, or the one conversation that woke the turn
        even where prose cannot go (an explicit post may, as into a channel that declares no
        publish target); otherwise the true reason there is none, in one line."""
        if self.pin is not None:
            return self.pin
        here = self.route_place()
        if here is not None:
            return here
        decision = self.decision
        if isinstance(decision, Unroutable):
            if decision.reason == "unresolved":
                return "the channel this turn came from is not registered now; name a channel"
            return self._place(decision.conversation)
        if isinstance(decision, Hold):
            return "several conversations woke this turn (the host never picks one); name one"
        return (
            "nothing woke this turn from a channel (the host never guesses one); name the channel"
        )

    def _place(self, conversation: tuple[str, str, str | None]) -> Place:
        """A conversation (server, channel, thread) as a place, with the channel's label."""
        sid, cid, thread = conversation
        label = next(
            (v.label for v in self.channels if v.server_id == sid and v.channel_id == cid), ""
        )
        return Place(server_id=sid, channel_id=cid, label=label, thread_id=thread)

    def set_route(self, place: Place) -> None:
        """A deliberate move of the route (``channel_open`` with set_speech_target); prose for
        a place that cannot take it is kept as drafts."""
        self.route = Route(
            server_id=place.server_id,
            channel_id=place.channel_id,
            thread_id=place.thread_id,
            deliberate=True,
        )
        self.pin = None
        self.suspended = False
        self._route_told = False

    def add_channel(self, view: ChannelView, place: str | None) -> None:
        if not any(
            v.server_id == view.server_id and v.channel_id == view.channel_id for v in self.channels
        ):
            self.channels.append(view)
        self.places[(view.server_id, view.channel_id)] = place

    def arrival(self, candidate: Candidate) -> None:
        """A wake that arrived mid-turn: an addressed (or engaged) one from another
        conversation suspends an inferred route."""
        if self.route is not None and not self.suspended:
            if suspends(self.route, candidate, engaged=self.engaged):
                self.suspended = True
                self._trace("route-suspended", None, by=list(candidate.conversation))

    def _resolve(self, token: str) -> Destination:
        found = resolve_target(token, self.channels)
        if isinstance(found, TargetError):
            cands = [place_of(v) for v in found.candidates]
            self._notice(target_error_notice(token, found.reason, cands))
            return Destination(kept="unresolved target")
        place = place_of(found)
        problem = place_problem(self.places.get((found.server_id, found.channel_id)), None)
        if problem is not None:
            self._notice(unroutable_notice(place, problem, addressed=True, mode=self.mode))
            return Destination(place=place, kept=problem)
        return Destination(place=place)

    def _route_problem(self) -> str | None:
        """Why the route's place cannot take prose (a deliberate route is not checked when it
        is set: its channel may declare no target); the agent is told once per route."""
        route = self.route
        if route is None:
            return None
        decl = self.places.get((route.server_id, route.channel_id))
        problem = place_problem(decl, route.thread_id)
        if problem is not None and not self._route_told:
            self._route_told = True
            here = self.route_place()
            assert here is not None
            self._notice(unroutable_notice(here, problem, mode=self.mode))
        return problem

    def _notice(self, text: str) -> None:
        if len(self.notices) < MAX_TURN_NOTICES:
            self.notices.append(text)
        else:
            self.notices_dropped += 1

    def _unprefixed(self) -> Destination:
        if self.pin is not None:
            return Destination(place=self.pin)
        if self.decision is None and self.local:
            # no channel woke the turn: the operator's input is its conversation, answered
            # where it was asked (the console, the transcript), never published
            return Destination(operator=True)
        if self.mode == "explicit":
            return Destination(kept="bounced")
        decision = self.decision
        if self.route is not None:
            here = self.route_place()
            if self.suspended:
                return Destination(place=here, kept="suspended")
            problem = self._route_problem()
            if problem is not None:
                return Destination(place=here, kept=problem)
            return Destination(place=here)
        if isinstance(decision, Hold):
            return Destination(kept="held")
        if isinstance(decision, Unroutable):
            self._unroutable_kept = True
            return Destination(place=self._place(decision.conversation), kept=decision.reason)
        return Destination(kept="no route")

    # -- whole rounds ------------------------------------------------------------------------
    def submit(self, text: str, *, silenced: str | None = None) -> None:
        """Route the prose of one round: each segment is sent, kept as a draft, or dropped
        (``skip_reply``); ``silenced`` names the tool that silenced the round."""
        if not text.strip():
            return
        if self.mode == "disabled":
            self.suppressed += sum(1 for s in split_segments(text, "locus") if s.body.strip())
            return
        for seg in split_segments(text, self.mode):
            body = seg.body.strip()
            self.rewake = self.rewake or seg.continue_turn
            if seg.target == SKIP:
                if body:
                    self.suppressed += 1
                continue
            if seg.target is not None:
                dest = self._resolve(seg.target)
                if dest.kept is None and dest.place is not None:
                    self.pin = dest.place  # a resolved target holds for the rest of the turn
            else:
                dest = self._unprefixed()
            if not body:
                continue
            if silenced is not None:
                dest = Destination(place=dest.place, kept=f"silenced by {silenced}")
            elif dest.operator:
                self.answered += 1
                self._trace("local-reply", None, text=body)
                continue
            if dest.kept is None and dest.place is not None:
                if self._queue(dest.place, body) is not None:
                    continue
                dest = Destination(place=dest.place, kept="speech queue full")
            self._keep(body, dest)

    def _keep(self, body: str, dest: Destination) -> None:
        reason = dest.kept or "kept"
        draft_id = self.drafts.add(body, reason, dest.place)
        self.kept.append((draft_id, reason))
        self._trace("speech-held", dest.place, text=body, reason=reason, draft=draft_id)

    def _queue(self, place: Place, body: str, *, prose: bool = True) -> Ticket | None:
        ticket = Ticket(
            place=place, text=body, key=f"{self.inference_id}:{next(self._keys)}", prose=prose
        )
        if not self.sender.send(ticket):
            return None
        self.tickets.append(ticket)
        self.engaged.add((place.server_id, place.channel_id))
        return ticket

    def send_explicit(self, place: Place, text: str) -> Ticket | None:
        """A tool's post (not prose): queued behind the turn's speech to that channel, and
        listed in the turn's receipt; None when the queue is full."""
        return self._queue(place, text, prose=False)

    def announce(self, text: str) -> Place | None:
        """Queue a host-written announcement (the sleep notice) where unaddressed prose would
        go now: the latest pin, else the route. None when there is nowhere to say it."""
        place = self.pin
        if place is None and self.route is not None and not self.suspended:
            place = self.route_place()
        if place is None or self.mode == "disabled":
            return None
        return place if self._queue(place, text) is not None else None

    # -- streaming --------------------------------------------------------------------------
    def start_round(self) -> None:
        self._router = ProseStreamRouter(self.mode if self.mode != "disabled" else "locus")
        self._stream_pin = self.pin

    def _stream_place(self, target: str | None) -> Place | None:
        if self.mode == "disabled":
            return None
        if target is None:
            if self._stream_pin is not None:
                return self._stream_pin
            if self.mode == "explicit" or self.route is None or self.suspended:
                return None
            return self.route_place()
        if target == SKIP:
            return None
        found = resolve_target(target, self.channels)
        if isinstance(found, TargetError):
            return None
        place = place_of(found)
        self._stream_pin = place
        return place

    def stream(self, delta: str) -> list[tuple[Place | None, str]]:
        """Feed one delta of the round's text; the pieces with where each would be published
        (None: nowhere, so not streamed)."""
        router = self._router
        if router is None:
            return []
        return [(self._stream_place(t), piece) for t, piece in router.feed(delta) if piece]

    def end_stream(self) -> list[tuple[Place | None, str]]:
        router, self._router = self._router, None
        if router is None:
            return []
        return [(self._stream_place(t), piece) for t, piece in router.finish() if piece]

    def chunk(self, place: Place, delta: str) -> dict[str, Any] | None:
        """The ``channels/outgoing/chunk`` params for ``delta``, or None where streaming is not
        allowed (the place is not declared, or the server was not granted streaming)."""
        decl = self.places.get((place.server_id, place.channel_id))
        if decl == LEGACY or place_problem(decl, place.thread_id) is not None:
            return None  # a stream goes only where the publish names its place
        status = self.ctx.statuses.get(place.server_id)
        if status is None or "channels.streaming" not in status.grant:
            return None
        params: dict[str, Any] = {
            "inferenceId": self.inference_id,
            "conversationId": conversation_id(self.agent),
            "channelId": place.channel_id,
            "index": self._chunk_index,
            "delta": delta,
            "threadId": place.thread_id,
        }
        self._chunk_index += 1
        self._streamed.setdefault((place.server_id, place.channel_id), place)
        return params

    def completes(self) -> list[tuple[str, dict[str, Any]]]:
        """One ``channels/outgoing/complete`` per channel that got chunks: the text actually
        queued for it this turn."""
        out = []
        for (sid, cid), place in self._streamed.items():
            text = "\n\n".join(
                t.text
                for t in self.tickets
                if (t.place.server_id, t.place.channel_id) == (sid, cid)
            )
            out.append(
                (
                    sid,
                    {
                        "inferenceId": self.inference_id,
                        "conversationId": conversation_id(self.agent),
                        "channelId": cid,
                        "content": [{"type": "text", "text": text}] if text else [],
                        "threadId": place.thread_id,
                    },
                )
            )
        self._streamed.clear()
        return out

    # -- the end -----------------------------------------------------------------------------
    async def sent(self) -> None:
        """Wait until every segment of this turn has its outcome (no scheduling round when
        every one has it already)."""
        for ticket in self.tickets:
            if not ticket.done.is_set():
                await ticket.done.wait()

    def _keep_failed(self) -> set[int]:
        """Keep as a draft every prose segment that was not published (refused, or never
        sent): nothing the agent wrote is lost. The indexes of those tickets."""
        kept: set[int] = set()
        for i, ticket in enumerate(self.tickets):
            outcome = ticket.outcome
            stopped = outcome is not None and outcome.reason in (CUT_SHORT, NOT_SENT_STOPPING)
            if not ticket.prose or (outcome is not None and outcome.status != "failed"):
                if not stopped:  # a post the stop cut short may not have landed: kept too
                    continue
            if outcome is None:
                reason = "not sent"
            elif stopped:
                reason = str(outcome.reason)
            else:
                reason = f"failed: {outcome.reason or 'refused'}"
            self._keep(ticket.text, Destination(place=ticket.place, kept=reason))
            kept.add(i)
        return kept

    async def settle(self) -> list[str]:
        """Wait for this turn's segments; the texts to store: notices, then the receipt."""
        await self.sent()
        failed = self._keep_failed()
        texts = list(self.notices)
        if self.notices_dropped:
            texts.append(f"[notices] {self.notices_dropped} more notices of this turn not shown")
        reasons = [r for _, r in self.kept]
        ids = [i for i, _ in self.kept]
        if "held" in reasons and isinstance(self.decision, Hold):
            places = [self._place(c) for c in self.decision.conversations]
            unknown = self.decision.multiple_unknown
            texts.append(hold_notice(places, multiple_unknown=unknown, mode=self.mode))
        bounced = [i for i, r in self.kept if r == "bounced"]
        if bounced:
            tokens = [target_token(v, self.channels) for v in self.channels]
            texts.append(bounce_notice(bounced, self.mode, tokens))
        if isinstance(self.decision, Unroutable) and self._unroutable_kept:
            texts.append(
                unroutable_notice(
                    self._place(self.decision.conversation), self.decision.reason, mode=self.mode
                )
            )
        if self.tickets or ids or self.suppressed or self.answered:
            deliveries = [
                Delivery(
                    place=t.place,
                    status=t.outcome.status if t.outcome is not None else "unknown",
                    reason=t.outcome.reason if t.outcome is not None else "not sent",
                    kept=i in failed,
                )
                for i, t in enumerate(self.tickets)
            ]
            texts.append(
                delivered_receipt(
                    deliveries,
                    drafts=len(ids),
                    suppressed=self.suppressed,
                    disabled=self.mode == "disabled",
                    operator=self.answered,
                )
            )
        return texts


class Typing:
    """A typing indicator on one channel, renewed every ``TYPING_REFRESH_S`` until stopped."""

    def __init__(self, ctx: HostContext, place: Place, trace: Callable[..., None]) -> None:
        self.ctx = ctx
        self.place = place
        self._trace = trace
        self.on = False

    def _send(self, typing: bool) -> None:
        params: dict[str, Any] = {"channelId": self.place.channel_id, "typing": typing}
        if self.place.thread_id is not None:
            params["threadId"] = self.place.thread_id
        if notify(self.ctx, self.place.server_id, "channels/typing", params):
            self._trace("typing", self.place, typing=typing)

    def start(self) -> None:
        self.on = True
        self._send(True)

    async def refresh(self) -> None:
        """Renew the indicator until it is stopped."""
        while self.on:
            await trio.sleep(TYPING_REFRESH_S)
            if self.on:
                self._send(True)

    def stop(self) -> None:
        if self.on:
            self.on = False
            self._send(False)


def typing_allowed(ctx: HostContext, place: Place, decl: str | None) -> bool:
    status = ctx.statuses.get(place.server_id)
    return (
        status is not None
        and "channels.typing" in status.grant
        and place_problem(decl, place.thread_id) is None
    )
