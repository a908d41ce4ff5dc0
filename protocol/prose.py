"""The speech grammar of an agent's prose, and resolution of the targets it names.

In ``explicit`` mode a line starting with ``>>TOKEN`` opens a segment aimed at TOKEN; in
``hybrid`` mode the opener is ``>>> TOKEN`` (spaces after ``>>>`` optional). ``locus`` and
``disabled`` have no grammar. After the token, `` !`` (spaces or tabs, then ``!`` followed by
whitespace or the end of the text) asks to continue the turn. The body starts after the spaces
that follow, or on the next line when nothing else is on the prefix line.

``split_segments`` parses a whole text; ``ProseStreamRouter`` parses it piece by piece and gives
the same bodies. The two are written independently on purpose, and tested against each other.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import attrs

MODES = ("locus", "explicit", "hybrid", "disabled")

#: The target that publishes nothing.
SKIP = "skip_reply"

#: How many channels a ``TargetError`` lists at most.
MAX_CANDIDATES = 10

_DM_TYPES = frozenset({"dm", "direct"})

# After the token: an optional modifier, then spaces/tabs, then at most one newline.
_TAIL = r"(?P<mod>[ \t]+!(?=\s|\Z))?[ \t]*\n?"
_PREFIX = {
    "explicit": re.compile(r"(?:^|(?<=\n))>>(?P<tok>[^\s>]\S*)" + _TAIL),
    "hybrid": re.compile(r"(?:^|(?<=\n))>>>[ \t]*(?P<tok>\S+)" + _TAIL),
}


@attrs.frozen(kw_only=True)
class Segment:
    """One stretch of prose: ``raw`` as authored, ``body`` as it would be published."""

    target: str | None
    body: str
    raw: str
    continue_turn: bool = False


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown prose mode {mode!r}; expected one of {', '.join(MODES)}")


def split_segments(text: str, mode: str) -> list[Segment]:
    """Cut ``text`` into segments; concatenating their ``raw`` gives ``text`` back."""
    _check_mode(mode)
    pattern = _PREFIX.get(mode)
    matches = [] if pattern is None else list(pattern.finditer(text))
    segments: list[Segment] = []
    first = matches[0].start() if matches else len(text)
    if first > 0:
        segments.append(Segment(target=None, body=text[:first], raw=text[:first]))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        segments.append(
            Segment(
                target=match["tok"],
                body=text[match.end() : end],
                raw=text[match.start() : end],
                continue_turn=match["mod"] is not None,
            )
        )
    return segments


# States of the stream router.
_BODY = "body"  # inside a body: emit
_LINE = "line"  # at the start of a line, nothing held yet
_GT1 = "gt1"  # held ">"
_GT2 = "gt2"  # held ">>"
_GT3 = "gt3"  # hybrid: held ">>>" and maybe spaces/tabs
_TOKEN = "token"  # reading the token
_GAP = "gap"  # spaces/tabs after the token; a "!" may follow
_BANG = "bang"  # token, spaces/tabs, "!": a modifier if whitespace or the end follows
_SKIP = "skip"  # spaces/tabs before the body


class ProseStreamRouter:
    """Character-level: fed the text in arbitrary pieces, emits ``(target, delta)`` pairs.

    Only body characters are emitted, tagged with their segment's target (``None`` before the
    first prefix). Text at a line start is held while it may still be a prefix, and released as
    soon as a character decides it.
    """

    def __init__(self, mode: str) -> None:
        _check_mode(mode)
        self._mode = mode
        self._grammar = mode in _PREFIX
        self._state = _LINE if self._grammar else _BODY
        self._target: str | None = None
        self._held = ""
        self._token = ""
        # what the current feed emits, as runs of one target each, in pieces (joined once, by
        # _take: a character at a time must not copy the run so far), and all emitted so far
        self._out: list[tuple[str | None, list[str]]] = []
        self._emitted: dict[str | None, list[str]] = {}

    def feed(self, delta: str) -> list[tuple[str | None, str]]:
        if not self._grammar:
            self._emit(delta)
        else:
            for char in delta:
                self._step(char)
        return self._take()

    def finish(self) -> list[tuple[str | None, str]]:
        """Decide whatever is held as if the text ended here."""
        if self._state in (_GT1, _GT2, _GT3):
            self._emit(self._held)
        elif self._state in (_TOKEN, _GAP, _BANG, _SKIP):
            self._open()
        self._held = ""
        self._state = _LINE if self._grammar else _BODY
        return self._take()

    def by_target(self) -> dict[str | None, str]:
        """Everything emitted so far, per target, in order of first emission."""
        return {target: "".join(pieces) for target, pieces in self._emitted.items()}

    def _step(self, char: str) -> None:
        state = self._state
        if state == _BODY:
            self._emit(char)
            if char == "\n":
                self._state = _LINE
        elif state == _LINE:
            if char == ">":
                self._hold(char, _GT1)
            else:
                self._state = _BODY
                self._step(char)
        elif state == _GT1:
            if char == ">":
                self._hold(char, _GT2)
            else:
                self._release(char)
        elif state == _GT2:
            if self._mode == "hybrid":
                if char == ">":
                    self._hold(char, _GT3)
                else:
                    self._release(char)
            elif char == ">" or char.isspace():
                self._release(char)
            else:
                self._begin_token(char)
        elif state == _GT3:
            if char in " \t":
                self._hold(char, _GT3)
            elif char.isspace():
                self._release(char)
            else:
                self._begin_token(char)
        elif state == _TOKEN:
            if not char.isspace():
                self._token += char
            elif char in " \t":
                self._state = _GAP
            else:
                self._end_header(char)
        elif state == _GAP:
            if char == "!":
                self._state = _BANG
            elif char not in " \t":
                self._end_header(char)
        elif state == _BANG:
            if char in " \t":
                self._state = _SKIP
            elif char.isspace():
                self._end_header(char)
            else:
                # "!" glued to text is not a modifier: it starts the body.
                self._open()
                self._state = _BODY
                self._emit("!")
                self._step(char)
        elif state == _SKIP and char not in " \t":
            self._end_header(char)

    def _hold(self, char: str, state: str) -> None:
        self._held += char
        self._state = state

    def _release(self, char: str) -> None:
        """What was held is not a prefix: it is body text of the current segment."""
        self._emit(self._held)
        self._held = ""
        self._state = _BODY
        self._step(char)

    def _begin_token(self, char: str) -> None:
        self._held = ""
        self._token = char
        self._state = _TOKEN

    def _open(self) -> None:
        self._target = self._token
        self._token = ""

    def _end_header(self, char: str) -> None:
        """The header is over; a newline right here belongs to it, anything else to the body."""
        self._open()
        if char == "\n":
            self._state = _LINE
        else:
            self._state = _BODY
            self._step(char)

    def _emit(self, text: str) -> None:
        if not text:
            return
        if self._out and self._out[-1][0] == self._target:
            self._out[-1][1].append(text)
        else:
            self._out.append((self._target, [text]))
        self._emitted.setdefault(self._target, []).append(text)

    def _take(self) -> list[tuple[str | None, str]]:
        out, self._out = self._out, []
        return [(target, "".join(pieces)) for target, pieces in out]


@attrs.frozen(kw_only=True)
class ChannelView:
    """What resolution needs to know about a channel."""

    server_id: str
    channel_id: str
    label: str = ""
    type: str = ""


@attrs.frozen(kw_only=True)
class TargetError:
    """A token that names no channel (``unknown``) or several (``ambiguous``)."""

    token: str
    reason: str
    candidates: tuple[ChannelView, ...]


def _order(view: ChannelView) -> tuple[str, str, str, str]:
    return (view.server_id, view.channel_id, view.label, view.type)


def _after_colon(channel_id: str) -> str | None:
    return channel_id.rsplit(":", 1)[1] if ":" in channel_id else None


def _label(view: ChannelView, marks: str) -> str:
    label = view.label
    if label[:1] and label[0] in marks:
        label = label[1:]
    return label.casefold()


def resolve_target(token: str, channels: Sequence[ChannelView]) -> ChannelView | TargetError:
    """Find the one channel ``token`` names; the first rule that matches anything decides."""
    views = sorted(set(channels), key=_order)
    folded = token.casefold()
    rules: list[Callable[[ChannelView], bool]] = [
        lambda v: v.channel_id == token,
        lambda v: token == f"{v.server_id}/{v.channel_id}",
        lambda v: _after_colon(v.channel_id) == token,
        lambda v: token[:1] == "#" and len(token) > 1 and _label(v, "#") == folded[1:],
        lambda v: (
            token[:1] == "@"
            and len(token) > 1
            and v.type.casefold() in _DM_TYPES
            and _label(v, "@") == folded[1:]
        ),
        lambda v: _label(v, "#@") == folded,
    ]
    if token:
        for rule in rules:
            found = [view for view in views if rule(view)]
            if len(found) == 1:
                return found[0]
            if found:
                return TargetError(
                    token=token, reason="ambiguous", candidates=tuple(found[:MAX_CANDIDATES])
                )
    return TargetError(token=token, reason="unknown", candidates=tuple(views[:MAX_CANDIDATES]))


def target_token(view: ChannelView, channels: Sequence[ChannelView]) -> str:
    """A whitespace-free token that resolves to ``view`` among ``channels``, if one exists.

    Tries ``#label``, then the channel id, then ``server/channel``; when none of them works,
    returns the channel id.
    """
    label = view.label.removeprefix("#")
    tries = [f"#{label}"] if label else []
    tries += [view.channel_id, f"{view.server_id}/{view.channel_id}"]
    for token in tries:
        if not any(char.isspace() for char in token) and resolve_target(token, channels) == view:
            return token
    return view.channel_id
