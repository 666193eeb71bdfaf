"""One client over several daemons: which daemon a call goes to, when it is retried
elsewhere or hedged, and which reply settles it. No sockets here: `edged.client`
sends and receives, and tells a `Call` (edged.client.call) what happened and when.

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
A client of one daemon sets nothing aside and never retries.

A fleet named by DNS (edged.client.members) changes while calls run: each daemon has a
slot, `live` while its address is in the records, `leaving` once it is not (it takes no
new copy, and the copies there still settle as any other), `free` once none is left (the
client has closed its socket, and a new daemon may take the slot). Slots are never
renumbered, so a copy's daemon is the same index from its send to its reply.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from edged.wire.codec import Reply

HEDGE_MIN_SAMPLES = 20  # no hedging on a model before this many replies: no p95 to go by
LATENCY_WINDOW = 512
LATENCY_DECAY_MS = 1000.0  # a daemon's round-trip estimate forgets at this pace
RTT_FLOOR_MS = 0.05  # so that daemons with no estimate yet tie, and share calls round robin
# Daemons within CHEAP_FACTOR of the cheapest, plus CHEAP_SLACK_MS, share the calls round
# robin: a hiccup of a fraction of a millisecond does not send every call to one daemon.
CHEAP_FACTOR = 2.0
CHEAP_SLACK_MS = 1.0
P95_EVERY = 32  # the p95 is recomputed after this many new samples, not per call

SlotState = Literal["live", "leaving", "free"]


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

    def __init__(
        self,
        endpoints: Sequence[str],
        hedge: bool = False,
        hedge_after_ms: float | None = None,
        followed: bool = False,
    ) -> None:
        """`followed`: the endpoints are a DNS name's answer, and `follow` changes them
        (an empty start is allowed: the name may not resolve yet)."""
        if not endpoints and not followed:
            raise ValueError("a client needs at least one endpoint")
        self.followed = followed
        self.latencies = Latencies()
        self.hedge = hedge
        self.hedge_after_ms = hedge_after_ms
        # Called when a call finds no daemon to take it (a followed name re-resolves at once).
        self.on_no_daemon: Callable[[], None] = lambda: None
        self.endpoints: list[str] = []
        self.counters: list[EndpointCounters] = []
        self.state: list[SlotState] = []
        self._aside_until: list[float] = []
        self._refusals: list[Reply | None] = []  # why each was set aside
        # Set aside for one model alone (not loaded there: UNAVAILABLE with scope "model"), by (daemon, model).
        self._model_aside: dict[tuple[int, str], tuple[float, Reply]] = {}
        # By daemon: copies of settled calls not yet answered (a hedge's loser, a copy given up on), by
        # request id, with until when they are remembered. A reply with no id from there may be theirs.
        self._unanswered: dict[int, dict[int, float]] = {}
        self._in_flight: list[int] = []  # copies of calls not yet settled
        self._rtt: list[float] = []  # time-weighted EWMA of round trips, ms
        self._rtt_at: list[float] = []
        self._leaving = 0
        self._next = 0
        for endpoint in endpoints:
            self._join(endpoint)

    @property
    def several(self) -> bool:
        return self.followed or len(self.endpoints) > 1

    def members(self) -> list[str]:
        """The daemons new copies may go to."""
        return [e for e, state in zip(self.endpoints, self.state) if state == "live"]

    def follow(self, endpoints: Sequence[str]) -> list[int]:
        """Make `endpoints` the members: those gone leave, those new join. Returns the
        slots that need a socket (new daemons); one that comes back while still leaving
        keeps its socket."""
        wanted = set(endpoints)
        for index, endpoint in enumerate(self.endpoints):
            if self.state[index] == "live" and endpoint not in wanted:
                self.state[index] = "leaving"
                self._leaving += 1
        opened = []
        for endpoint in endpoints:
            index = self._slot_of(endpoint)
            if index is not None and self.state[index] == "leaving":
                self.state[index] = "live"
                self._leaving -= 1
            elif index is None:
                opened.append(self._join(endpoint))
        return opened

    def settled_leavers(self) -> list[int]:
        """The leaving daemons with no copy left in flight, now free: the client closes their sockets."""
        if not self._leaving:
            return []
        done = [i for i, state in enumerate(self.state) if state == "leaving" and self._in_flight[i] == 0]
        for index in done:
            self.state[index] = "free"
        self._leaving -= len(done)
        return done

    def _slot_of(self, endpoint: str) -> int | None:
        for index, (known, state) in enumerate(zip(self.endpoints, self.state)):
            if known == endpoint and state != "free":
                return index
        return None

    def _join(self, endpoint: str) -> int:
        """A slot for a new daemon, with nothing learnt: a free one (none of its copies
        is in flight, or it would not be free), else a new one."""
        if "free" not in self.state:
            self.endpoints.append(endpoint)
            self.counters.append(EndpointCounters())
            self.state.append("live")
            self._aside_until.append(0.0)
            self._refusals.append(None)
            self._in_flight.append(0)
            self._rtt.append(0.0)
            self._rtt_at.append(-math.inf)  # so that the first sample is taken whole
            return len(self.state) - 1
        index = self.state.index("free")
        self.endpoints[index], self.counters[index], self.state[index] = endpoint, EndpointCounters(), "live"
        self._aside_until[index], self._refusals[index] = 0.0, None
        self._model_aside = {key: aside for key, aside in self._model_aside.items() if key[0] != index}
        self._unanswered.pop(index, None)
        self._rtt[index], self._rtt_at[index] = 0.0, -math.inf
        return index

    def pick(self, now: float, exclude: set[int], model: str | None = None) -> int | None:
        """The next daemon, neither excluded nor set aside (for `model`), among the cheapest:
        round robin over those whose cost is close to the lowest."""
        count = len(self.endpoints)
        costs = [
            math.inf if i in exclude or self._back_at(i, model) > now or self.state[i] != "live" else self._cost(i, now)
            for i in range(count)
        ]
        best = min(costs, default=math.inf)
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

    def soonest_back(self, exclude: set[int], model: str | None = None) -> float:
        """When the first daemon not excluded comes back from being set aside, for `model` (inf: none)."""
        return min(
            (self._back_at(i, model) for i in range(len(self.state)) if i not in exclude and self.state[i] == "live"),
            default=math.inf,
        )

    def _back_at(self, index: int, model: str | None) -> float:
        """When daemon `index` takes calls of `model` again (a time past: now)."""
        aside = self._model_aside.get((index, model)) if model is not None else None
        return max(self._aside_until[index], aside[0]) if aside is not None else self._aside_until[index]

    def tried_all(self, tried: set[int]) -> bool:
        """Whether a call that tried `tried` has had a copy on every member (none: not yet)."""
        live = [i for i, state in enumerate(self.state) if state == "live"]
        return bool(live) and all(i in tried for i in live)

    def set_aside(self, index: int, until: float, refusal: Reply, model: str | None = None) -> None:
        """Take no calls to daemon `index` until `until`: of `model` alone, where given."""
        if not self.several:
            return
        if model is not None:
            earlier = self._model_aside.get((index, model), (0.0, refusal))[0]
            self._model_aside[(index, model)] = (max(earlier, until), refusal)
        else:
            self._aside_until[index] = max(self._aside_until[index], until)
            self._refusals[index] = refusal

    def refusal(self, now: float, model: str | None = None) -> Reply | None:
        """The refusal of the daemon set aside (for `model`) that comes back first: the answer
        of a call that no daemon may take before it ends."""
        aside = [i for i in range(len(self.state)) if self._back_at(i, model) > now and self.state[i] == "live"]
        if not aside:
            return None
        first = min(aside, key=lambda i: self._back_at(i, model))
        for_model = self._model_aside.get((first, model)) if model is not None else None
        if for_model is not None and for_model[0] > self._aside_until[first]:
            return for_model[1]
        return self._refusals[first]

    def leave_unanswered(self, copies: dict[int, int], until: float, now: float) -> None:
        """A settled call's copies not yet answered (request id: daemon), remembered until `until`;
        those remembered past their time are forgotten (a daemon that never answers keeps none)."""
        for index in {*copies.values()}:
            left = self._unanswered.setdefault(index, {})
            for stale in [copy for copy, kept in left.items() if kept <= now]:
                del left[stale]
        for request_id, index in copies.items():
            self._unanswered[index][request_id] = until

    def owner(self, request_id: int | None, index: int, now: float, awaited: Callable[[], list[int]]) -> int | None:
        """The copy a reply from daemon `index` answers: its id's. With none (the daemon could not
        read it), the one copy `awaited` there; but while a settled call's copy there is unanswered,
        none: that copy's reply it may be, and a call must never take another's. Taken for the
        oldest such copy's, it ends that copy's wait."""
        left = self._unanswered.get(index)
        if request_id is not None:
            if left:
                left.pop(request_id, None)
            return request_id
        if left:
            for stale in [copy for copy, until in left.items() if until <= now]:
                del left[stale]
            if left:
                del left[next(iter(left))]
                return None
        ids = awaited()
        return ids[0] if len(ids) == 1 else None

    def hedge_delay_ms(self, model: str | None) -> float | None:
        if not (self.hedge and self.several and model):
            return None
        return self.hedge_after_ms if self.hedge_after_ms is not None else self.latencies.p95(model)
