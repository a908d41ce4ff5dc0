"""The loop rules of ``protocol.loops``: texts compared, an agent's recent posts and own
accounts remembered (at their caps), and the loop breaker as a state machine (time is a
parameter)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from protocol.loops import (
    COOL_DOWN_S,
    KEY_CHARS,
    LIMIT,
    MAX_CHANNELS,
    MAX_OWN_AUTHORS,
    MAX_POSTS,
    PERSON_CPS,
    PERSON_MIN_S,
    QUIET_S,
    REPEAT_WINDOW_S,
    WINDOW_S,
    LoopBreaker,
    OwnAuthors,
    RecentPosts,
    Verdict,
    normalise,
    repeat_keys,
    typed_by_a_person,
)

words = st.lists(
    st.text(alphabet=st.characters(blacklist_categories=["Cs", "Zs", "Cc", "Zl", "Zp"])),
    min_size=1,
    max_size=6,
).filter(lambda ws: any(ws))
spaces = st.text(alphabet=" \t\n\r\u00a0\u2003", min_size=1, max_size=4)
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABC -_", min_size=1, max_size=30).filter(
    lambda n: bool(n.strip())
)

# -- comparing texts --------------------------------------------------------------------------


@given(st.text())
def test_normalising_is_idempotent(text: str) -> None:
    assert normalise(normalise(text)) == normalise(text)


@given(words, st.lists(spaces, min_size=6, max_size=6), spaces, spaces)
def test_runs_of_whitespace_and_the_ends_do_not_count(
    parts: list[str], gaps: list[str], before: str, after: str
) -> None:
    spaced = before + "".join(w + g for w, g in zip(parts, gaps, strict=False)).rstrip() + after
    assert normalise(spaced) == normalise(" ".join(parts))


@given(st.text())
def test_case_does_not_count(text: str) -> None:
    assert normalise(text.upper()) == normalise(text.upper().casefold())
    assert normalise(text) == normalise(text.casefold())


@given(names, st.text(min_size=1))
def test_a_speakers_prefix_is_also_compared_without(name: str, text: str) -> None:
    keys = repeat_keys(text)
    if not keys:
        return
    assert keys[0] in repeat_keys(f"{name}: {text}")
    assert keys[0] in repeat_keys(f"{name.upper()}:{text}")


def test_examples_of_keys() -> None:
    assert repeat_keys("  Tell me\n MORE  ") == ("tell me more",)
    assert repeat_keys("Ada: Tell me more") == ("ada: tell me more", "tell me more")
    assert repeat_keys("") == () and repeat_keys(" \n ") == ()
    long_name = "x" * 41
    assert repeat_keys(f"{long_name}: hi") == (f"{long_name}: hi",)  # not a speaker's prefix
    assert len(repeat_keys("y" * (KEY_CHARS * 3))[0]) == KEY_CHARS


# -- an agent's recent posts ------------------------------------------------------------------


def test_a_repeat_is_recognised_in_its_channel_within_the_window() -> None:
    posts = RecentPosts()
    posts.note("general", "Tell me more about that.", 100.0)
    assert posts.repeats("general", "tell me   more about THAT.", 100.0 + REPEAT_WINDOW_S)
    assert posts.repeats("general", "Ada: Tell me more about that.", 150.0)
    assert not posts.repeats("random", "Tell me more about that.", 150.0)  # another channel
    assert not posts.repeats("general", "Tell me less about that.", 150.0)
    assert not posts.repeats("general", "", 150.0)
    assert not posts.repeats("general", "Tell me more about that.", 100.1 + REPEAT_WINDOW_S)
    assert len(posts) == 0  # forgotten once it was past the window


def test_at_the_cap_the_oldest_post_is_forgotten_first() -> None:
    posts = RecentPosts()
    for i in range(MAX_POSTS):
        posts.note("general", f"post number {i}", 0.0)
    assert len(posts) == MAX_POSTS
    assert posts.repeats("general", "post number 0", 1.0)
    posts.note("general", f"post number {MAX_POSTS}", 1.0)  # one past the cap
    assert len(posts) == MAX_POSTS
    assert not posts.repeats("general", "post number 0", 1.0)
    assert posts.repeats("general", "post number 1", 1.0)
    assert posts.repeats("general", f"post number {MAX_POSTS}", 1.0)


def test_an_empty_post_is_not_remembered() -> None:
    posts = RecentPosts()
    posts.note("general", "  ", 0.0)
    assert len(posts) == 0


class RecentPostsMachine(RuleBasedStateMachine):
    """RecentPosts against a list of (time, channel, text): the last ``cap`` posts, none older
    than the window."""

    def __init__(self) -> None:
        super().__init__()
        self.posts = RecentPosts()
        self.model: list[tuple[float, str, str]] = []
        self.now = 0.0

    @initialize(cap=st.integers(1, 5), window=st.sampled_from([1.0, 10.0]))
    def setup(self, cap: int, window: float) -> None:
        self.posts = RecentPosts(cap=cap, window_s=window)

    def _expire(self) -> None:
        self.model = [p for p in self.model if self.now - p[0] <= self.posts.window_s]

    @rule(
        dt=st.sampled_from([0.0, 0.5, 1.0, 3.0]), channel=st.sampled_from("ab"), n=st.integers(0, 4)
    )
    def note(self, dt: float, channel: str, n: int) -> None:
        self.now += dt
        self.posts.note(channel, f"text {n}", self.now)
        self._expire()
        self.model = [*self.model, (self.now, channel, f"text {n}")][-self.posts.cap :]

    @rule(
        dt=st.sampled_from([0.0, 0.5, 1.0, 3.0]), channel=st.sampled_from("ab"), n=st.integers(0, 4)
    )
    def check(self, dt: float, channel: str, n: int) -> None:
        self.now += dt
        self._expire()
        expected = any(c == channel and t == f"text {n}" for _, c, t in self.model)
        assert self.posts.repeats(channel, f"TEXT  {n}", self.now) == expected

    @invariant()
    def bounded(self) -> None:
        assert len(self.posts) <= self.posts.cap


TestRecentPosts = RecentPostsMachine.TestCase


# -- the accounts a channel knows as agents' own -------------------------------------------------


def test_own_authors_name_their_agents() -> None:
    own = OwnAuthors()
    own.note("bot-1", "Ada")
    own.note("bot-1", "Grace")
    own.note("", "Ada")  # no account: nothing learnt
    assert own.agents("bot-1") == {"Ada", "Grace"}
    assert own.agents("alice") == frozenset() and own.agents(None) == frozenset()
    assert len(own) == 1


def test_at_the_cap_the_least_recently_seen_account_is_forgotten() -> None:
    own = OwnAuthors()
    for i in range(MAX_OWN_AUTHORS):
        own.note(f"bot-{i}", "Ada")
    own.note("bot-0", "Ada")  # seen again: now the most recent
    own.note("bot-new", "Ada")  # one past the cap
    assert len(own) == MAX_OWN_AUTHORS
    assert own.agents("bot-1") == frozenset()  # the least recently seen
    assert own.agents("bot-0") == {"Ada"} and own.agents("bot-new") == {"Ada"}


# -- the loop breaker ---------------------------------------------------------------------------


def loop(breaker: LoopBreaker, channel: str, author: str, times: list[float]) -> list[bool]:
    """The agent posts, then ``author`` answers at each of ``times``; whether each woke it."""
    out = []
    for now in times:
        breaker.published(channel)
        out.append(breaker.observe(channel, author, now).wake)
    return out


def test_a_channel_the_agent_has_not_posted_in_is_not_followed() -> None:
    breaker = LoopBreaker()
    assert all(breaker.observe("general", "bot", float(t)).wake for t in range(50))
    assert len(breaker) == 0


def test_the_post_after_the_limit_trips_the_breaker_and_its_partner_waits() -> None:
    breaker = LoopBreaker()
    woke = loop(breaker, "general", "bot", [float(t) for t in range(LIMIT + 3)])
    assert woke == [True] * LIMIT + [False] * 3
    assert breaker.deferring("general")
    assert breaker.answers("general") == LIMIT  # at most ``limit + 1`` are ever kept
    # someone else speaks: the deferral ends there, and that item wakes the agent
    verdict = breaker.observe("general", "alice", LIMIT + 3.0)
    assert verdict.wake and verdict.released == "another voice" and verdict.held == 3
    assert not breaker.deferring("general") and breaker.answers("general") == 0


def test_the_trip_tells_how_many_posts_were_answered_and_over_what_time() -> None:
    breaker = LoopBreaker()
    loop(breaker, "general", "bot", [float(t) for t in range(LIMIT)])
    breaker.published("general")
    verdict = breaker.observe("general", "bot", 10.0)
    assert verdict.tripped and not verdict.wake
    assert verdict.answers == LIMIT + 1 and verdict.seconds == 10.0


def test_answers_spread_wider_than_the_window_never_trip() -> None:
    breaker = LoopBreaker()
    step = WINDOW_S / LIMIT + 0.01
    assert all(loop(breaker, "general", "bot", [i * step for i in range(40)]))


def test_items_that_answer_nothing_never_trip() -> None:
    breaker = LoopBreaker()
    breaker.published("general")
    assert all(breaker.observe("general", "bot", float(t)).wake for t in range(40))


def test_the_partner_going_on_is_still_a_loop() -> None:
    """A bot that answers each post with two messages: the second answers nothing, but it is
    the partner's, so the chain goes on."""
    breaker = LoopBreaker()
    woke = []
    for t in range(LIMIT + 2):
        breaker.published("general")
        woke.append(breaker.observe("general", "bot", float(t)).wake)
        woke.append(breaker.observe("general", "bot", t + 0.5).wake)
    assert woke == [True] * (2 * LIMIT) + [False] * 4


def test_another_voice_answering_starts_the_chain_again() -> None:
    breaker = LoopBreaker()
    loop(breaker, "general", "bot", [float(t) for t in range(LIMIT)])
    breaker.published("general")
    assert breaker.observe("general", "alice", 6.0).wake  # the post after the limit
    assert breaker.answers("general") == 1
    assert loop(breaker, "general", "alice", [7.0, 8.0]) == [True, True]
    assert breaker.answers("general") == 3


def test_another_voice_speaking_unanswered_ends_the_chain() -> None:
    """A conversation: people talk whether the agent posted or not."""
    breaker = LoopBreaker()
    loop(breaker, "general", "bot", [float(t) for t in range(LIMIT)])
    assert breaker.observe("general", "alice", 5.5).wake  # the agent had not posted again
    assert breaker.answers("general") == 0
    assert (
        loop(breaker, "general", "bot", [float(t) for t in range(6, 6 + LIMIT)]) == [True] * LIMIT
    )


def test_a_quiet_channel_ends_the_deferral() -> None:
    breaker = LoopBreaker()
    loop(breaker, "general", "bot", [float(t) for t in range(LIMIT + 1)])
    last = float(LIMIT)
    assert not breaker.observe("general", "bot", last + QUIET_S - 1).wake
    # quiet counts from the last deferred item
    assert not breaker.observe("general", "bot", last + 2 * QUIET_S - 2).wake
    verdict = breaker.observe("general", "bot", last + 3 * QUIET_S)
    assert verdict.wake and verdict.released == "quiet" and verdict.held == 3


def test_the_cool_down_ends_a_deferral_however_busy_the_channel() -> None:
    breaker = LoopBreaker()
    loop(breaker, "general", "bot", [float(t) for t in range(LIMIT + 1)])
    tripped = float(LIMIT)
    now = tripped
    while now + 10 < tripped + COOL_DOWN_S:
        now += 10
        assert not breaker.observe("general", "bot", now).wake
    verdict = breaker.observe("general", "bot", tripped + COOL_DOWN_S)
    assert verdict.wake and verdict.released == "cool-down"


def test_channels_are_followed_apart() -> None:
    breaker = LoopBreaker()
    loop(breaker, "general", "bot", [float(t) for t in range(LIMIT + 1)])
    assert breaker.deferring("general") and not breaker.deferring("random")
    assert loop(breaker, "random", "bot", [10.0]) == [True]


def test_at_the_channel_cap_the_least_recently_active_is_forgotten() -> None:
    breaker = LoopBreaker()
    loop(breaker, "c0", "bot", [float(t) for t in range(LIMIT + 1)])
    assert breaker.deferring("c0")
    for i in range(1, MAX_CHANNELS):
        breaker.published(f"c{i}")
    assert len(breaker) == MAX_CHANNELS and breaker.deferring("c0")
    breaker.published("c-new")  # one past the cap: c0 was the least recently active
    assert len(breaker) == MAX_CHANNELS
    assert not breaker.deferring("c0")
    assert breaker.observe("c0", "bot", 10.0).wake  # no longer followed: it wakes


def test_limits_must_be_sane() -> None:
    with pytest.raises(ValueError):
        LoopBreaker(limit=0)
    with pytest.raises(ValueError):
        LoopBreaker(window_s=0)
    with pytest.raises(ValueError):
        RecentPosts(cap=0)
    with pytest.raises(ValueError):
        OwnAuthors(cap=0)


@given(
    limit=st.integers(1, 6),
    gaps=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40),
)
def test_a_loop_wakes_the_agent_limit_times_then_waits(limit: int, gaps: list[float]) -> None:
    """One voice answering every post, each answer within ``window / limit`` of the last (so
    any ``limit + 1`` of them fall in one window): exactly ``limit`` wake the agent, then it
    waits, as long as the channel does not go quiet and the cool-down is not over."""
    window = 10.0
    breaker = LoopBreaker(limit=limit, window_s=window, quiet_s=2 * window, cool_down_s=1000.0)
    now, times = 0.0, []
    for gap in gaps:
        now += gap * window / limit
        times.append(now)
    woke = loop(breaker, "general", "bot", times)
    assert woke == [True] * min(limit, len(times)) + [False] * max(0, len(times) - limit)


class BreakerMachine(RuleBasedStateMachine):
    """The loop breaker of one agent against a model of its rule (see ``protocol.loops``)."""

    def __init__(self) -> None:
        super().__init__()
        self.breaker = LoopBreaker()
        self.now = 0.0
        self.order: list[str] = []  # the followed channels, the least recently active first
        self.armed: dict[str, bool] = {}
        self.partner: dict[str, str | None] = {}
        self.answers: dict[str, list[float]] = {}
        self.tripped: dict[str, tuple[float, float]] = {}  # channel -> (trip, last held)

    @initialize(limit=st.integers(1, 4), max_channels=st.integers(1, 3))
    def setup(self, limit: int, max_channels: int) -> None:
        self.breaker = LoopBreaker(
            limit=limit, window_s=10.0, quiet_s=5.0, cool_down_s=20.0, max_channels=max_channels
        )

    def _touch(self, channel: str) -> None:
        self.order = [c for c in self.order if c != channel] + [channel]

    def _end(self, channel: str) -> None:
        self.partner[channel] = None
        self.answers[channel] = []
        self.tripped.pop(channel, None)

    @rule(channel=st.sampled_from(["a", "b", "c"]))
    def publish(self, channel: str) -> None:
        self.breaker.published(channel)
        if channel not in self.armed:
            self._end(channel)
        self.armed[channel] = True
        self._touch(channel)
        for gone in self.order[: -self.breaker.max_channels]:
            for known in (self.armed, self.partner, self.answers, self.tripped):
                known.pop(gone, None)
        self.order = self.order[-self.breaker.max_channels :]

    @rule(
        channel=st.sampled_from(["a", "b", "c"]),
        voice=st.sampled_from(["bot", "alice", "bea"]),
        dt=st.sampled_from([0.0, 0.5, 1.0, 3.0, 6.0, 12.0]),
    )
    def item(self, channel: str, voice: str, dt: float) -> None:
        self.now += dt
        verdict = self.breaker.observe(channel, voice, self.now)
        if channel not in self.armed:
            assert verdict == Verdict(wake=True)  # not followed
            return
        self._touch(channel)
        released = None
        if channel in self.tripped:
            trip, last = self.tripped[channel]
            if voice != self.partner[channel]:
                released = "another voice"
            elif self.now - last >= self.breaker.quiet_s:
                released = "quiet"
            elif self.now - trip >= self.breaker.cool_down_s:
                released = "cool-down"
            else:
                assert verdict == Verdict(wake=False)
                self.armed[channel] = False
                self.tripped[channel] = (trip, self.now)
                return
            self._end(channel)
        assert verdict.released == released
        answered, self.armed[channel] = self.armed[channel], False
        if voice != self.partner[channel]:
            self._end(channel)
            if answered:
                self.partner[channel] = voice
        if not answered:
            assert verdict.wake and not verdict.tripped  # an item that answers nothing
            return
        window = [t for t in self.answers[channel] if self.now - t <= self.breaker.window_s]
        self.answers[channel] = [*window, self.now]
        if len(self.answers[channel]) <= self.breaker.limit:
            assert verdict.wake and not verdict.tripped
            return
        assert verdict.tripped and not verdict.wake and verdict.released is None
        assert verdict.answers == self.breaker.limit + 1
        assert 0 <= verdict.seconds <= self.breaker.window_s
        self.answers[channel].pop(0)
        self.tripped[channel] = (self.now, self.now)

    @invariant()
    def bounded_and_agreeing(self) -> None:
        assert len(self.breaker) == len(self.order) <= self.breaker.max_channels
        for channel in self.order:
            assert self.breaker.deferring(channel) == (channel in self.tripped)
            assert self.breaker.answers(channel) == len(self.answers[channel])
            assert self.breaker.answers(channel) <= self.breaker.limit


TestBreaker = BreakerMachine.TestCase


def test_the_defaults() -> None:
    assert (LIMIT, WINDOW_S, QUIET_S, COOL_DOWN_S) == (5, 60.0, 60.0, 300.0)
    assert (MAX_POSTS, REPEAT_WINDOW_S, MAX_CHANNELS, MAX_OWN_AUTHORS) == (64, 300.0, 64, 16)


# -- a person's pace -----------------------------------------------------------------------------

answers = st.lists(
    st.tuples(st.floats(0, 30, allow_nan=False), st.integers(0, 400)), min_size=1, max_size=60
)


@given(answers)
def test_a_person_answering_every_post_never_trips_the_breaker(
    paces: list[tuple[float, int]],
) -> None:
    """However many posts a person answers in a minute, each answer that came slower than it
    could be typed is a conversation: nothing is deferred."""
    breaker = LoopBreaker()
    now = 0.0
    for extra, length in paces:
        breaker.published("general", now)
        waited = PERSON_MIN_S + length / PERSON_CPS + 0.001 + extra
        assert typed_by_a_person(waited, length)
        now += waited
        assert breaker.observe("general", "alice", now, length).wake
        now += 1.0  # the agent's turn
    assert not breaker.deferring("general")


@given(st.lists(st.integers(0, 400), min_size=LIMIT + 1, max_size=LIMIT + 1))
def test_answers_at_a_machine_pace_trip_it(lengths: list[int]) -> None:
    breaker = LoopBreaker()
    now, woke = 0.0, []
    for length in lengths:
        breaker.published("general", now)
        now += PERSON_MIN_S * 0.5  # sooner than anyone types
        woke.append(breaker.observe("general", "bot", now, length).wake)
        now += 1.0
    assert woke == [True] * LIMIT + [False]


def test_a_person_s_answer_ends_a_chain_of_machine_answers() -> None:
    breaker = LoopBreaker()
    for n in range(LIMIT):  # the bot answers at once, LIMIT times
        breaker.published("general", float(n))
        assert breaker.observe("general", "bot", n + 0.1, 40).wake
    breaker.published("general", 10.0)
    assert breaker.observe("general", "bot", 20.0, 40).wake  # slower than anyone types 40
    assert breaker.answers("general") == 0
    breaker.published("general", 21.0)
    assert breaker.observe("general", "bot", 21.1, 40).wake  # the chain starts again
