"""The dearest job a class's loop may run inline rather than hand to a worker (read in
edged.serve.dispatch): fixed per lane at start-up, bounded at each arrival by what a
hand-off costs now."""

from __future__ import annotations

from dataclasses import dataclass

from edged.config.classes import ClassConfig

# The derived cap (inline_max_us left out): a job a worker's two hand-offs (Loop.handoff_ns)
# would slow by 2% or more, so at most INLINE_HANDOFFS of them; and at most 1/INLINE_SHARE of the
# shortest deadline the loop reads, since it reads nothing meanwhile (docs/benchmarks.md).
INLINE_HANDOFFS = 100
INLINE_SHARE = 10


@dataclass(frozen=True, slots=True)
class InlineCap:
    """`most_ns` (0: never inline), `in_turn_ns` (with requests behind it), and whether the
    loop's measured hand-off bounds it too (`derived`)."""

    most_ns: int
    in_turn_ns: int
    derived: bool

    @classmethod
    def of(cls, klass: ClassConfig, loop_deadline_ms: float | None = None) -> InlineCap:
        """`loop_deadline_ms`: the shortest deadline the lane's loop reads (the default class's
        loop reads every class's requests); None: its class's own."""
        deadline_ns = (loop_deadline_ms or klass.deadline_ms) * 1e6
        if not klass.runs_inline:
            most_ns = 0
        elif klass.inline_max_us is not None:
            most_ns = klass.inline_max_us * 1000
        else:
            most_ns = int(deadline_ns / INLINE_SHARE)
        # Requests behind an inline one wait unread in the socket, so unadmitted and unshed:
        # run in turn, a full queue of them must fit in one deadline (tests/client/test_client.py).
        in_turn_ns = int(deadline_ns / klass.queue_capacity)
        return cls(most_ns, in_turn_ns, derived=klass.inline_max_us is None)

    def limit_ns(self, handoff_ns: float, behind: bool = False) -> int:
        """The cap now, given a hand-off's cost; `behind`: requests wait behind this one on its socket."""
        limit = min(self.most_ns, int(INLINE_HANDOFFS * handoff_ns)) if self.derived else self.most_ns
        return min(limit, self.in_turn_ns) if behind else limit
