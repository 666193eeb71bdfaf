"""One call over a fleet of daemons: its copies, from the first send to the reply (or
silence) that settles it, by the rules edged.client.fleet sets out."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from edged.client.fleet import Fleet
from edged.wire.codec import Reply, Status

UNAVAILABLE_PAUSE_MS = 1000.0  # a starting or draining daemon: seconds, not milliseconds
SEND_POLL_MS = 5.0  # how often a call retries a send no daemon could take (none connected)
# A settled call's copy not yet answered is remembered this long after the settle at most (its call's
# timeout, if shorter).
UNANSWERED_KEPT_MS = 60_000.0

# send(endpoint index, deadline_ms or None) -> the request id sent, or None if that
# daemon's socket took nothing (ZMQ_IMMEDIATE: not connected).
SendFn = Callable[[int, float | None], int | None]


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
    _now: float = 0.0  # the clock as last given (advance, on_reply): when a settle happens

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
        self._now = now
        if self.done:
            return
        if now >= self.end:
            for copy in self.copies.values():
                if not copy.given_up:
                    self.fleet.counters[copy.endpoint].timed_out += 1
            # A copy still awaited makes it a timeout: an earlier refusal would pass a hung daemon off as a busy one.
            self._settle(None if self.copies else self.refusal)
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

    def copies_on(self, endpoint: int) -> list[int]:
        """The ids of the copies awaited from `endpoint`. A reply whose id the daemon could not
        read (a header over its limit) carries none: where one copy alone waits there, it is
        that copy's."""
        return [request_id for request_id, copy in self.copies.items() if copy.endpoint == endpoint]

    def on_reply(self, request_id: int | None, reply: Reply, now: float, send: SendFn) -> bool:
        """Take a reply; False if it belongs to no copy still awaited (the caller counts it late)."""
        self._now = now
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
            # A model not loaded there sets that daemon aside for the model alone, not for every call.
            alone = self.model if reply.header.get("scope") == "model" else None
            self.fleet.set_aside(copy.endpoint, now + pause, reply, alone)
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

    def abandon(self) -> None:
        """Settle the call with nothing, if still open: its caller has gone (a task cancelled)."""
        if not self.done:
            self._settle(None)

    def _first_waiting(self) -> bool:
        return any(not copy.given_up for copy in self.copies.values())

    def _send(self, now: float, send: SendFn) -> None:
        hedge = self._want == "hedge"
        # The first try goes as given, the daemon judging it (0 or less included); a later one with what is left.
        left = self.deadline_ms
        if left is not None and (self._sent or self._send_again_at < math.inf):
            left -= now - self.started
            if left <= 0:
                self._cannot_send()
                return
        refused: set[int] = set()
        while (index := self.fleet.pick(now, self._tried | refused, self.model)) is not None:
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
        if hedge or self.fleet.tried_all(self._tried):
            self._cannot_send()  # a hedge is now or never; and every daemon has had its copy
            return
        self.fleet.on_no_daemon()
        # One not connected may connect, one set aside comes back, or (a fleet named by
        # DNS, none known yet) one joins: look again then.
        none_known = not self.fleet.members()
        again = now + SEND_POLL_MS if refused or none_known else self.fleet.soonest_back(self._tried, self.model)
        if again >= self.end:
            self.refusal = self.refusal or self.fleet.refusal(now, self.model)
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
        # From the settle on: a copy a timeout left unanswered may be answered just after it.
        now = max(self._now, self.started)
        unanswered = {request_id: copy.endpoint for request_id, copy in self.copies.items()}
        self.fleet.leave_unanswered(unanswered, now + min(self.timeout_ms, UNANSWERED_KEPT_MS), now)
        self.done = True
        self.reply = reply
        self._want = None
