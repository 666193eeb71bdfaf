"""The dearest job a class's loop may run inline rather than hand to a worker (read in
edged.serve.dispatch): fixed per lane at start-up where set, else bounded at each arrival
by what a hand-off costs now and by the shortest deadline the loop has read lately."""

from __future__ import annotations

import math
from dataclasses import dataclass

from edged.config.classes import ClassConfig

# The derived cap (inline_max_us left out): a job a worker's two hand-offs (Loop.handoff_ns)
# would slow by 2% or more, so at most INLINE_HANDOFFS of them; and at most 1/INLINE_SHARE of the
# shortest deadline among the requests the loop reads, since it reads nothing meanwhile (docs/benchmarks.md).
INLINE_HANDOFFS = 100
INLINE_SHARE = 10
# A deadline read counts toward the shortest for one or two spans this long: a client that sends
# realtime's requests to the shared endpoints now and then keeps that loop's cap at realtime's, and
# once it has stopped for a while, a default-class job of a few ms no longer goes to a worker.
DEADLINE_KEPT_NS = 10_000_000_000


@dataclass(frozen=True, slots=True)
class InlineCap:
    """`most_ns` (0: never inline; derived: a share of the class's own deadline), whether the
    loop's measures bound it too (`derived`), and the class's deadline and queue capacity."""

    most_ns: int
    derived: bool
    deadline_ms: float
    queue_capacity: int

    @classmethod
    def of(cls, klass: ClassConfig) -> InlineCap:
        if not klass.runs_inline:
            most_ns = 0
        elif klass.inline_max_us is not None:
            most_ns = klass.inline_max_us * 1000
        else:
            most_ns = int(klass.deadline_ms * 1e6 / INLINE_SHARE)
        return cls(most_ns, klass.inline_max_us is None, klass.deadline_ms, klass.queue_capacity)

    def limit_ns(self, handoff_ns: float, behind: bool = False, read_ms: float | None = None) -> int:
        """The cap now, given a hand-off's cost and the shortest deadline the loop read lately
        (`read_ms`: LoopDeadlines.shortest_ms; None: the class's own); `behind`: requests wait
        behind this one on its socket."""
        # Never past the class's own: a loop that read only long deadlines still has requests of its
        # class's default behind an inline one.
        read_ms = min(read_ms or self.deadline_ms, self.deadline_ms)
        limit = self.most_ns
        if self.derived:
            limit = min(limit, int(INLINE_HANDOFFS * handoff_ns), int(read_ms * 1e6 / INLINE_SHARE))
        # Requests behind an inline one wait unread in the socket, so unadmitted and unshed:
        # run in turn, a full queue of them must fit in one deadline (tests/client/test_client.py).
        return min(limit, int(read_ms * 1e6 / self.queue_capacity)) if behind else limit


class LoopDeadlines:
    """The shortest deadline among the requests a loop has read lately: in this span of
    DEADLINE_KEPT_NS and the one before it, spans laid end to end on the monotonic clock, so
    that each counts for 10 to 20 s. Written by that loop alone, at each request it reads and as it
    takes up lanes: `shortest_ms` is as of the last read (the stats op reads it from any thread)."""

    __slots__ = ("_earlier_ms", "_span_ms", "_span_ns", "shortest_ms")

    def __init__(self) -> None:
        self.shortest_ms = self._span_ms = self._earlier_ms = math.inf
        self._span_ns = 0

    def read(self, deadline_ms: float, now_ns: int) -> None:
        spans = (now_ns - self._span_ns) // DEADLINE_KEPT_NS
        if spans:
            # The span before still counts, unless a whole one went by unread.
            self._earlier_ms = self._span_ms if spans == 1 else math.inf
            self._span_ms, self._span_ns = deadline_ms, self._span_ns + spans * DEADLINE_KEPT_NS
        elif deadline_ms < self._span_ms:
            self._span_ms = deadline_ms
        self.shortest_ms = min(self._earlier_ms, self._span_ms)
