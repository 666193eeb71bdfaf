"""A pipeline priced for one request: what admission takes it to cost, and whether it
still fits its deadline from a given step on.

A pipeline is admitted once, at arrival (`Lane.offer`), for the dearer of its critical
path (each step's price, learned under its own name as it runs, by the request's size)
and what its whole runs cost on average, with their bound kept in hand. Its worker asks
again before each step (`Priced.late`), by the steps' prices, and ends the request with
`StepLate` when the rest of the path no longer fits.
"""

from __future__ import annotations

from dataclasses import dataclass

from edged.models.pipeline import Pipeline, Step
from edged.serve.pricing import ServiceTimes


class StepLate(Exception):
    """A step that would end past the request's deadline, by the steps' prices; names it."""


@dataclass(frozen=True, slots=True)
class Priced:
    """A pipeline as one request sees it, priced once: each step's price on the lane, by
    the request's size, and from each step on, the time to the pipeline's end; what its
    whole runs cost on average (`whole_ns`) and at most but rarely (`bound_ns`), as they
    measured it; and the hand-off to a worker before it starts."""

    pipeline: Pipeline
    prices: dict[str, int]
    tails: dict[str, int]
    whole_ns: int = 0
    bound_ns: int = 0
    handoff_ns: int = 0

    @classmethod
    def of(cls, pipeline: Pipeline, service: ServiceTimes, rows: int, elements: int, handoff_ns: float = 0.0) -> Priced:
        """`handoff_ns`: what a hand-off to a worker costs now (the loop's measure of its own)."""
        prices = {step.name: service.charge_ns(step.key, rows, elements) for step in pipeline.steps}
        whole_ns = service.charge_ns(pipeline.name, rows, elements)
        bound_ns = service.bound_ns(pipeline.name, rows, elements)
        return cls(pipeline, prices, pipeline.tails(prices), whole_ns, bound_ns, int(handoff_ns))

    @property
    def span_ns(self) -> int:
        """What the request costs: its critical path's steps after the hand-off to a worker,
        or, where dearer, what its whole runs cost on average, for that covers what the
        steps' prices leave out (the hand-off, the bookkeeping between steps, the wait for
        a parallel branch, the join). What admission keeps in hand beyond it: `bound_ns`."""
        return max(self.pipeline.span_ns(self.tails) + self.handoff_ns, self.whole_ns)

    def late(self, left_ns: int, start: Step | None = None) -> str | None:
        """Why the pipeline (from `start` on) cannot end within `left_ns`, naming the first
        step of its critical path that would end past it; None when it fits."""
        if (self.tails[start.name] if start is not None else max(self.span_ns, self.bound_ns)) <= left_ns:
            return None
        chain = self.pipeline.longest(self.prices, self.tails, start)
        path = ", ".join(f"{step.name} {self.prices[step.name] / 1e6:.3f}" for step, _ in chain)
        # Its steps may fit where its whole runs, measured, do not: then the last one is late.
        late = next((step for step, end_ns in chain if end_ns > left_ns), chain[-1][0])
        whole = f"; its whole runs rarely pass {self.bound_ns / 1e6:.3f} ms" if start is None and self.bound_ns else ""
        return (
            f"step {late.name!r} ({late.runs}) would end past the deadline: the pipeline's critical path "
            f"from there is {chain[-1][1] / 1e6:.3f} ms ({path} ms){whole}, and {max(left_ns, 0) / 1e6:.3f} ms "
            "are left"
        )

    def shed(self, left_ns: int, why: str) -> str:
        """The sentence of a shed at arrival: the first step of the critical path to end
        past the deadline, or, where the work queued ahead is what does not fit (`why`,
        admission's own sentence), the last."""
        name = self.pipeline.name
        if (late := self.late(left_ns)) is not None:
            return f"pipeline {name!r}: {late}"
        last = self.pipeline.longest(self.prices, self.tails)[-1][0]
        return f"pipeline {name!r} would end past the deadline at its last step, {last.name!r}: {why}"
