"""What a class's loop may run itself, inline, rather than hand to a worker: fixed per
lane at start-up, bounded at each arrival by what a hand-off costs the loop now
(edged.serve.lanes.lane places the job; edged.serve.dispatch says whether requests wait
behind it)."""

from __future__ import annotations

from dataclasses import dataclass

from edged.config.classes import ClassConfig

# Where classes.NAME.inline_max_us is left out: a job that a worker's two hand-offs
# (each as the loop measures its own: Loop.handoff_ns) would slow by 2% or more, so at
# most INLINE_HANDOFFS of them; and never more than 1/INLINE_SHARE of the shortest
# deadline among the requests the loop reads, since it reads none meanwhile. A tenth, not
# a twentieth: realtime's cap was then 1 ms, and cnn-heavy's 1.4 ms call went through a
# worker, whose two hand-offs made its round trip 2,007 us p50 against 1,758 us inline,
# the light model's unchanged (209 against 212 us; two daemons interleaved, 2026-11-28).
INLINE_HANDOFFS = 100
INLINE_SHARE = 10


@dataclass(frozen=True, slots=True)
class InlineCap:
    """A lane's inline cap: `most_ns` (inline_max_us where set; else a share of the
    loop's deadline; 0: never inline), `in_turn_ns` (with requests behind it), and
    whether the loop's measured hand-off bounds it too (`derived`)."""

    most_ns: int
    in_turn_ns: int
    derived: bool

    @classmethod
    def of(cls, klass: ClassConfig, loop_deadline_ms: float | None = None) -> InlineCap:
        """`loop_deadline_ms`: the shortest deadline among the requests the lane's loop
        reads (the default class's loop reads the shared endpoints, for every class);
        None: its class's own."""
        deadline_ns = (loop_deadline_ms or klass.deadline_ms) * 1e6
        if not klass.runs_inline:
            most_ns = 0
        elif klass.inline_max_us is not None:
            most_ns = klass.inline_max_us * 1000
        else:
            most_ns = int(deadline_ns / INLINE_SHARE)
        # Requests behind one run inline wait in the socket, unread, so unadmitted and
        # unshed: run in turn, a full queue of them must fit in one deadline. Realtime's
        # 40-request burst of cnn-heavy was otherwise run 1.4 ms at a time, the last
        # answered OK 65 ms after it was sent, none shed (tests/client/test_client.py).
        in_turn_ns = int(deadline_ns / klass.queue_capacity)
        return cls(most_ns, in_turn_ns, derived=klass.inline_max_us is None)

    def limit_ns(self, handoff_ns: float, behind: bool = False) -> int:
        """The dearest job the loop may run inline now, given what a hand-off to it costs;
        `behind`: other requests wait behind this one on its socket."""
        limit = min(self.most_ns, int(INLINE_HANDOFFS * handoff_ns)) if self.derived else self.most_ns
        return min(limit, self.in_turn_ns) if behind else limit
