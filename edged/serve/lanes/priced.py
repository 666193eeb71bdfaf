"""A pipeline priced for one request: what admission (`Lane.offer`) takes it to cost at arrival, and, asked by
its worker before each step (`Priced.late`), whether the rest still fits its deadline (else `StepLate`)."""

from __future__ import annotations

from dataclasses import dataclass

from edged.models.pipeline import Pipeline, Step
from edged.serve.pricing import ServiceTimes


class StepLate(Exception):
    """A step that would end past the request's deadline, by the steps' prices; names it."""


@dataclass(frozen=True, slots=True)
class Priced:
    """A pipeline priced once for one request's size: each step's price, the time from each step to the end
    (`tails`), what whole runs cost on average (`whole_ns`) and rarely pass (`bound_ns`), and the hand-off."""

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
        """What the request costs: its critical path after the hand-off, or its whole runs' average where dearer,
        for that covers what the steps' prices leave out (bookkeeping between steps, a parallel branch, the join)."""
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
        """A shed at arrival, in words: the first critical-path step to end past the deadline, or the last where
        the work queued ahead is what does not fit (`why`, admission's own sentence)."""
        name = self.pipeline.name
        if (late := self.late(left_ns)) is not None:
            return f"pipeline {name!r}: {late}"
        last = self.pipeline.longest(self.prices, self.tails)[-1][0]
        return f"pipeline {name!r} would end past the deadline at its last step, {last.name!r}: {why}"
