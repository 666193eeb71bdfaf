"""One client over several daemons: which daemon a call goes to, when it is retried
elsewhere or hedged, and which reply settles it. No sockets here: `edged.client`
sends and receives, and tells a `Call` what happened and when.

After the ZeroMQ guide's Lazy Pirate and Freelance patterns (chapter 4), with hedged
requests after Dean and Barroso, "The Tail at Scale" (CACM 2013):
- a call goes to one daemon, round robin over those not set aside;
- OVERLOADED sets that daemon aside for its `retry_after_ms`, UNAVAILABLE (starting,
  draining) for UNAVAILABLE_PAUSE_MS, and the call is retried at once on another;
- no reply within half the call's budget (its `deadline_ms`, else its timeout) sends
  the call to another daemon, with what is left of its deadline;
- with hedging, a copy goes to another daemon once the call has waited the hedge
  delay (by default this client's running p95 for the model).
A call sends at most two copies, the first reply that is not a retryable refusal
settles it, and it settles exactly once: a later reply is dropped and counted `late`.
A client of one daemon sets nothing aside and never retries: it behaves as before.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from edged.wire.codec import Reply, Status

UNAVAILABLE_PAUSE_MS = 1000.0  # a starting or draining daemon: seconds, not milliseconds
SEND_POLL_MS = 5.0  # how often a call retries a send no daemon could take (none connected)
HEDGE_MIN_SAMPLES = 20  # no hedging on a model before this many replies: no p95 to go by
LATENCY_WINDOW = 512
LATENCY_DECAY_MS = 1000.0  # a daemon's round-trip estimate forgets at this pace
RTT_FLOOR_MS = 0.05  # so that daemons with no estimate yet tie, and share calls round robin
# Daemons within CHEAP_FACTOR of the cheapest, plus CHEAP_SLACK_MS, share the calls round
# robin: a hiccup of a fraction of a millisecond does not send every call to one daemon.
CHEAP_FACTOR = 2.0
CHEAP_SLACK_MS = 1.0
P95_EVERY = 32  # the p95 is recomputed after this many new samples, not per call

# send(endpoint index, deadline_ms or None) -> the request id sent, or None if that
# daemon's socket took nothing (ZMQ_IMMEDIATE: not connected).
SendFn = Callable[[int, float | None], int | None]


@dataclass(slots=True)
class EndpointCounters:
    """What one daemon of the fleet did with this client's requests."""

    sent: int = 0  # copies sent, hedges included
    ok: int = 0  # OK replies that settled a call
    shed: int = 0  # OVERLOADED replies
    unavailable: int = 0  # UNAVAILABLE replies
    failed: int = 0  # other error replies, handed to the caller
    timed_out: int = 0  # copies given up on: no reply within the call's share, or by its end
    hedged: int = 0  # hedge copies sent here
    hedge_won: int = 0  # of those, the ones whose reply settled the call
    late: int = 0  # replies to calls already settled (the loser of a race, a reply after a give-up): dropped


class Latencies:
    """Each model's recent round trips (OK replies), for the hedge delay."""

    def __init__(self) -> None:
        self._samples: dict[str, deque[float]] = {}
        self._p95: dict[str, float] = {}
        self._fresh: dict[str, int] = {}

    def observe(self, model: str, ms: float) -> None:
        samples = self._samples.setdefault(model, deque(maxlen=LATENCY_WINDOW))
        samples.append(ms)
        self._fresh[model] = self._fresh.get(model, 0) + 1
        if len(samples) >= HEDGE_MIN_SAMPLES and (model not in self._p95 or self._fresh[model] >= P95_EVERY):
            ordered = sorted(samples)
            self._p95[model] = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
            self._fresh[model] = 0

    def p95(self, model: str) -> float | None:
        return self._p95.get(model)


class Fleet:
    """The daemons one client talks to, and what it has learnt about each."""

    def __init__(self, endpoints: Sequence[str], hedge: bool = False, hedge_after_ms: float | None = None) -> None:
        if not endpoints:
            raise ValueError("a client needs at least one endpoint")
        self.endpoints = list(endpoints)
        self.counters = [EndpointCounters() for _ in self.endpoints]
        self.latencies = Latencies()
        self.hedge = hedge
        self.hedge_after_ms = hedge_after_ms
        self._aside_until = [0.0] * len(self.endpoints)
        self._refusals: list[Reply | None] = [None] * len(self.endpoints)  # why each was set aside
        self._in_flight = [0] * len(self.endpoints)  # copies of calls not yet settled
        self._rtt = [0.0] * len(self.endpoints)  # time-weighted EWMA of round trips, ms
        self._rtt_at = [-math.inf] * len(self.endpoints)  # so that the first sample is taken whole
        self._next = 0

    @property
    def several(self) -> bool:
        return len(self.endpoints) > 1

    def pick(self, now: float, exclude: set[int]) -> int | None:
        """The next daemon, neither excluded nor set aside, among the cheapest: round
        robin over those whose cost is close to the lowest."""
        count = len(self.endpoints)
        costs = [math.inf if i in exclude or self._aside_until[i] > now else self._cost(i, now) for i in range(count)]
        best = min(costs)
        if best == math.inf:
            return None
        for step in range(count):
            index = (self._next + step) % count
            if costs[index] <= best * CHEAP_FACTOR + CHEAP_SLACK_MS:
                self._next = index + 1
                return index
        return None

    def _cost(self, index: int, now: float) -> float:
        """Copies in flight there, plus one, times its recent round trip (after the EWMA
        load balancing of Finagle and Linkerd). A daemon slowed by another client's flood
        gets no calls while the others are quick, and a second look once its estimate
        has decayed (LATENCY_DECAY_MS): one call in seconds, not one in three."""
        decayed = self._rtt[index] * math.exp(-(now - self._rtt_at[index]) / LATENCY_DECAY_MS)
        return (self._in_flight[index] + 1) * max(decayed, RTT_FLOOR_MS)

    def sent(self, index: int) -> None:
        self._in_flight[index] += 1

    def ended(self, index: int) -> None:
        """A copy there is over: answered, or its call settled without it."""
        self._in_flight[index] -= 1

    def observe_rtt(self, index: int, now: float, rtt_ms: float) -> None:
        """Blend a round trip in, weighted by the time since the last: a daemon asked often
        moves smoothly (one hiccup among hundreds hardly counts), one asked seldom
        (because it was slow) takes its new sample almost whole."""
        weight = math.exp(-(now - self._rtt_at[index]) / LATENCY_DECAY_MS)
        self._rtt[index] = self._rtt[index] * weight + rtt_ms * (1 - weight)
        self._rtt_at[index] = now

    def soonest_back(self, exclude: set[int]) -> float:
        """When the first daemon not excluded comes back from being set aside (inf: none)."""
        return min((t for i, t in enumerate(self._aside_until) if i not in exclude), default=math.inf)

    def set_aside(self, index: int, until: float, refusal: Reply) -> None:
        if self.several:
            self._aside_until[index] = max(self._aside_until[index], until)
            self._refusals[index] = refusal

    def refusal(self, now: float) -> Reply | None:
        """The refusal of the set-aside daemon that comes back first: the answer of a call
        that no daemon may take before it ends."""
        aside = [i for i, until in enumerate(self._aside_until) if until > now]
        return self._refusals[min(aside, key=self._aside_until.__getitem__)] if aside else None

    def hedge_delay_ms(self, model: str | None) -> float | None:
        if not (self.hedge and self.several and model):
            return None
        return self.hedge_after_ms if self.hedge_after_ms is not None else self.latencies.p95(model)


@dataclass(slots=True)
class _Copy:
    endpoint: int
    sent_at: float
    hedge: bool
    given_up: bool = False


@dataclass
class Call:
    """One call's copies, from the first send to the reply (or silence) that settles it.
    Times are milliseconds on one monotonic clock, given by the caller."""

    fleet: Fleet
    model: str | None
    deadline_ms: float | None
    timeout_ms: float
    started: float
    copies: dict[int, _Copy] = field(default_factory=dict)  # by request id, not yet answered
    done: bool = False
    reply: Reply | None = None  # what settled it; None with done: nothing came (or no daemon could take it)
    refusal: Reply | None = None  # the last OVERLOADED or UNAVAILABLE, returned if nothing better comes
    _tried: set[int] = field(default_factory=set)
    _sent: int = 0
    _want: str | None = "first"  # a copy waiting to be sent: "first", "retry" or "hedge"
    _send_again_at: float = math.inf

    def __post_init__(self) -> None:
        budget = self.deadline_ms if self.deadline_ms is not None else self.timeout_ms
        self.end = self.started + self.timeout_ms
        self._give_up_at = self.started + budget / 2 if self.fleet.several else math.inf
        delay = self.fleet.hedge_delay_ms(self.model)
        self._hedge_at = self.started + delay if delay is not None else math.inf

    def wake_at(self) -> float:
        """When `advance` must run again if no reply comes first."""
        if self._want is not None:
            return min(self._send_again_at, self.end)
        if self._sent >= 2:
            return self.end
        return min(self._give_up_at if self._first_waiting() else math.inf, self._hedge_at, self.end)

    def advance(self, now: float, send: SendFn) -> None:
        """Act on the clock: send what waits, give up on a silent copy, hedge, or end."""
        if self.done:
            return
        if now >= self.end:
            for copy in self.copies.values():
                if not copy.given_up:
                    self.fleet.counters[copy.endpoint].timed_out += 1
            self._settle(self.refusal)
            return
        if self._want is None and self._sent == 1:
            if now >= self._give_up_at and self._first_waiting():
                for copy in self.copies.values():
                    copy.given_up = True
                    self.fleet.counters[copy.endpoint].timed_out += 1
                    self.fleet.observe_rtt(copy.endpoint, now, now - copy.sent_at)  # at least that slow
                self._want = "retry"
            elif now >= self._hedge_at:
                self._want = "hedge"
        if self._want is not None:
            self._send(now, send)

    def on_reply(self, request_id: int, reply: Reply, now: float, send: SendFn) -> bool:
        """Take a reply; False if it belongs to no copy still awaited (the caller counts it late)."""
        copy = self.copies.pop(request_id, None)
        if copy is None or self.done:
            return False
        self.fleet.ended(copy.endpoint)
        counters = self.fleet.counters[copy.endpoint]
        if reply.status in (Status.OVERLOADED, Status.UNAVAILABLE):
            if reply.status is Status.OVERLOADED:
                counters.shed += 1
                pause = float(reply.header.get("retry_after_ms", 0.0))
            else:
                counters.unavailable += 1
                pause = UNAVAILABLE_PAUSE_MS
            self.fleet.set_aside(copy.endpoint, now + pause, reply)
            self.refusal = reply
            if self._sent < 2 and self.fleet.several:
                self._want = "retry"
                self._send(now, send)
            if not self.copies and self._want is None:
                self._settle(reply)
            return True
        # A refusal's quick round trip says nothing of how fast the daemon serves: only answers count.
        self.fleet.observe_rtt(copy.endpoint, now, now - copy.sent_at)
        if reply.status is Status.OK:
            counters.ok += 1
            if self.model:
                self.fleet.latencies.observe(self.model, now - copy.sent_at)
        else:
            counters.failed += 1
        if copy.hedge:
            counters.hedge_won += 1
        self._settle(reply)
        return True

    def _first_waiting(self) -> bool:
        return any(not copy.given_up for copy in self.copies.values())

    def _send(self, now: float, send: SendFn) -> None:
        hedge = self._want == "hedge"
        left = self.deadline_ms  # sent as given at once (the daemon judges it), else what is left of it
        if left is not None and now > self.started:
            left -= now - self.started
            if left <= 0:
                self._cannot_send()
                return
        refused: set[int] = set()
        while (index := self.fleet.pick(now, self._tried | refused)) is not None:
            request_id = send(index, left)
            if request_id is None:
                refused.add(index)  # not connected: try the next one
                continue
            self.copies[request_id] = _Copy(index, now, hedge)
            self.fleet.sent(index)
            self._tried.add(index)
            self._sent += 1
            self._want = None
            counters = self.fleet.counters[index]
            counters.sent += 1
            counters.hedged += hedge
            return
        if hedge or len(self._tried) == len(self.fleet.endpoints):
            self._cannot_send()  # a hedge is now or never; and every daemon has had its copy
            return
        # One not connected may connect, or one set aside comes back: look again then.
        again = now + SEND_POLL_MS if refused else self.fleet.soonest_back(self._tried)
        if again >= self.end:
            self.refusal = self.refusal or self.fleet.refusal(now)
            self._cannot_send()
            return
        self._send_again_at = again

    def _cannot_send(self) -> None:
        self._want = None
        self._hedge_at = math.inf
        if not self.copies:
            self._settle(self.refusal)

    def _settle(self, reply: Reply | None) -> None:
        for copy in self.copies.values():  # the losers, and copies never answered
            self.fleet.ended(copy.endpoint)
        self.done = True
        self.reply = reply
        self._want = None
