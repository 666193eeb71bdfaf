"""Pipelines: several models (and Python glue) behind one model name, as a graph.

A step is a model of the repository or a Python function (`module:function`, called
with one numpy array per input and returning a dict of arrays). Each step's inputs
name a request input (`image`) or an earlier step's output (`det.probability`); the
steps form a graph with no cycle, whose critical path admission prices. The manifest
that declares one is read and checked in edged.models.pipeline_manifest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edged.models.repository import ModelEntry
from edged.models.warmup import ModelFailure
from edged.wire.codec import TensorSpec

BACKEND = "pipeline"  # what `models` shows as a pipeline's backend


class PipelineError(ModelFailure):
    """A pipeline that cannot be served; the message names the pipeline, the step and the key."""


@dataclass(frozen=True, slots=True)
class Ref:
    """Where a tensor comes from: a request input (`step` None) or a step's output."""

    step: str | None
    tensor: str

    def __str__(self) -> str:
        return self.tensor if self.step is None else f"{self.step}.{self.tensor}"


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    inputs: tuple[tuple[str, Ref], ...]  # (the model's input or the function's argument, its source)
    outputs: tuple[TensorSpec, ...]
    after: frozenset[str]  # the steps whose outputs it takes
    key: str  # its price's name in the lane's ServiceTimes: "pipeline/step"
    model: ModelEntry | None = None
    function: Callable[..., Mapping[str, np.ndarray]] | None = None
    python: str = ""  # the function's "module:function"

    @property
    def runner(self) -> str:
        """What runs it: its model's runner, or its own function."""
        return self.model.name if self.model is not None else self.key

    @property
    def runs(self) -> str:
        """What it runs, as errors name it."""
        return f"model {self.model.name}" if self.model is not None else f"Python step {self.python}"

    def to_wire(self) -> dict[str, Any]:
        """The step as `models` lists it."""
        if self.model is not None:
            return {"name": self.name, "model": self.model.name}
        return {"name": self.name, "python": self.python}


@dataclass(frozen=True, slots=True)
class Pipeline:
    """A checked pipeline: its steps in waves (each wave's steps take only what the
    waves before it made; `steps` is their order, one that runs every step after the
    steps it takes from) and where each of its outputs comes from."""

    name: str
    waves: tuple[tuple[Step, ...], ...]
    outputs: tuple[tuple[str, Ref], ...]
    children: Mapping[str, tuple[Step, ...]] = field(init=False)  # by step: the steps that take from it

    def __post_init__(self) -> None:
        taking = {step.name: tuple(s for s in self.steps if step.name in s.after) for step in self.steps}
        object.__setattr__(self, "children", taking)

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(step for wave in self.waves for step in wave)

    @property
    def models(self) -> frozenset[str]:
        return frozenset(step.model.name for step in self.steps if step.model is not None)

    def tails(self, prices: Mapping[str, int]) -> dict[str, int]:
        """By step, the time from its start to the pipeline's end along the longest path
        on from it, each step taking its price and starting once what it takes is made."""
        tails: dict[str, int] = {}
        for step in reversed(self.steps):
            tails[step.name] = prices[step.name] + max((tails[c.name] for c in self.children[step.name]), default=0)
        return tails

    def span_ns(self, tails: Mapping[str, int]) -> int:
        """The whole pipeline's critical path: the sum along a chain, the longest of parallel branches."""
        return max(tails[step.name] for step in self.waves[0])

    def longest(
        self, prices: Mapping[str, int], tails: Mapping[str, int], start: Step | None = None
    ) -> list[tuple[Step, int]]:
        """The critical path from `start` (None: the pipeline's start), each step with
        the time it ends, counted from the start."""
        step = start or max(self.waves[0], key=lambda s: tails[s.name])
        chain, end = [], 0
        while True:
            end += prices[step.name]
            chain.append((step, end))
            after = self.children[step.name]
            if not after:
                return chain
            step = max(after, key=lambda s: tails[s.name])


def waves(name: str, where: str, steps: dict[str, Step]) -> tuple[tuple[Step, ...], ...]:
    """The steps by wave: each after every step it takes from; a cycle is refused, named."""
    waves, done = [], set[str]()
    left = dict(steps)
    while left:
        ready = [step for step in left.values() if step.after <= done]
        if not ready:
            cycle = " -> ".join(sorted(left))
            raise PipelineError(name, f"pipeline {name!r} ({where}): the steps {cycle} wait on each other (a cycle)")
        waves.append(tuple(ready))
        done.update(step.name for step in ready)
        for step in ready:
            del left[step.name]
    return tuple(waves)
