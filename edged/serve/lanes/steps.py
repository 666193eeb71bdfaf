"""A pipeline's steps, run for one admitted request on the worker of its lane that took it.

On one worker, a step never queues behind other requests mid-pipeline, intermediate tensors stay in its
memory, and Python steps never run on a class's loop. Steps whose inputs are ready together run at once,
on the worker and on branch threads it started (inheriting its niceness and cores). Each step is priced
under its own key (`pipeline/step`) for the next request's critical path (edged.serve.lanes.priced).
On the GPU backends, an output that only GPU runners read next stays on the device (`Stepper.kept`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, cast

import numpy as np

from edged.backends import DeviceTensor, KeepsOnDevice, Runner
from edged.models.pipeline import Pipeline, PipelineError, Ref, Step
from edged.models.repository import ModelEntry
from edged.serve.lanes.batching import named
from edged.serve.lanes.warming import WARMUP_RUNS
from edged.serve.pricing import ServiceTimes, price_clock
from edged.wire.tensors import DTYPES

# A tensor between steps: a host array, or (on the GPU backends) a model's output it kept on the device.
Value = np.ndarray | DeviceTensor


class StepFailed(Exception):
    """A step that raised or returned what it declared it would not; names the step."""


class Stepper:
    """One worker's way through its lane's pipelines: its runners, and the threads that run a pipeline's
    other branches (none where no pipeline fans out)."""

    def __init__(self, runners: Mapping[str, Runner], service: ServiceTimes, width: int) -> None:
        self._runners = runners
        self._service = service
        self._branches = ThreadPoolExecutor(width - 1, thread_name_prefix="pipeline-branch") if width > 1 else None
        # By pipeline name: the pipeline planned (a reload brings a new one) and its plan.
        self._plans: dict[str, tuple[Pipeline, dict[str, tuple[str, ...]]]] = {}

    def run(
        self,
        pipeline: Pipeline,
        inputs: Mapping[str, np.ndarray],
        rows: int,
        elements: int,
        before_step: Callable[[Step, set[str]], None] = lambda step, done: None,
    ) -> dict[str, np.ndarray]:
        """The pipeline's outputs for `inputs`; each step runs once its inputs are made, after
        `before_step(step, done)` (which may raise to end the request). Raises StepFailed naming the
        failed step, once the steps running are done."""
        values: dict[Ref, Value] = {Ref(None, name): array for name, array in inputs.items()}
        todo, done = list(pipeline.steps), set[str]()
        running: dict[Future[dict[str, Value]], Step] = {}
        plan = self.kept(pipeline)

        def record(step: Step, made: dict[str, Value]) -> None:
            values.update((Ref(step.name, name), array) for name, array in made.items())
            done.add(step.name)

        try:
            while todo or running:
                ready = self._ready(todo, done, {step.runner for step in running.values()})
                for step in ready:
                    before_step(step, done)
                    todo.remove(step)
                for step in ready[1:]:
                    assert self._branches is not None
                    running[self._branches.submit(self._step, step, values, rows, elements, None)] = step
                if ready:
                    record(ready[0], self._step(ready[0], values, rows, elements, plan.get(ready[0].name)))
                finished = [f for f in running if f.done()] if ready else wait(running, return_when=FIRST_COMPLETED)[0]
                for future in finished:
                    record(running.pop(future), future.result())
        finally:
            wait(running)  # a failed request's branches end before the worker takes the next
        # A pipeline's outputs are never kept on the device (`kept`): host arrays all.
        return {name: cast("np.ndarray", values[ref]) for name, ref in pipeline.outputs}

    def kept(self, pipeline: Pipeline) -> dict[str, tuple[str, ...]]:
        """By step, the outputs it leaves on the device, for every step that makes or takes one (a taker that
        keeps none: ()). Its runner lends its output buffer and the next copies it device to device, instead of
        a download and upload. Empty unless steps run one at a time (width 1) on KeepsOnDevice runners."""
        planned = self._plans.get(pipeline.name)
        if planned is None or planned[0] is not pipeline:
            planned = self._plans[pipeline.name] = (pipeline, self._plan(pipeline))
        return planned[1]

    def _plan(self, pipeline: Pipeline) -> dict[str, tuple[str, ...]]:
        """An output is kept when it is no pipeline output, every taker is a model step on a keeping runner, and its
        own runner does not run again before the last taker (that run would overwrite the buffer it lends)."""
        if self._branches is not None:
            return {}  # branch threads: a lent buffer would be read on another thread's stream

        def keeps(step: Step) -> bool:
            return step.model is not None and isinstance(self._runners.get(step.model.name), KeepsOnDevice)

        steps = pipeline.steps
        order = {step.name: i for i, step in enumerate(steps)}
        replied = {ref for _, ref in pipeline.outputs}
        plan: dict[str, tuple[str, ...]] = {}
        for i, step in enumerate(steps):
            if not keeps(step):
                continue
            kept = []
            for spec in step.outputs:
                ref = Ref(step.name, spec.name)
                takers = [c for c in pipeline.children[step.name] if any(r == ref for _, r in c.inputs)]
                if ref in replied or not takers or not all(keeps(c) for c in takers):
                    continue
                last = max(order[c.name] for c in takers)
                if any(other.runner == step.runner for other in steps[i + 1 : last]):
                    continue
                kept.append(spec.name)
                for taker in takers:
                    plan.setdefault(taker.name, ())
            if kept:
                plan[step.name] = tuple(kept)
        return plan

    def timed(
        self,
        entry: ModelEntry,
        inputs: Mapping[str, np.ndarray],
        before_step: Callable[[Step, set[str]], None] = lambda step, done: None,
        bounding: bool = False,
    ) -> None:
        """Run `entry`'s pipeline on a sample, pricing its steps and, under the pipeline's name, the whole;
        `bounding`: the run counts toward the pipeline's bound too (a re-timing's, warm, unlike warm-up's)."""
        assert entry.pipeline is not None
        elements = entry.signature.elements(dict(inputs))
        start = time.perf_counter_ns()
        self.run(entry.pipeline, inputs, 1, elements, before_step)
        observe = self._service.observe_run if bounding else self._service.observe
        observe(entry.name, time.perf_counter_ns() - start, 1, elements)

    def warm(self, entry: ModelEntry) -> None:
        """WARMUP_RUNS runs of the pipeline a warm-up sample: each step warm and priced; PipelineError if one fails."""
        for sample in entry.samples:
            inputs = sample.inputs()
            for _ in range(WARMUP_RUNS):
                try:
                    self.timed(entry, inputs)
                except StepFailed as exc:
                    shapes = {name: list(array.shape) for name, array in inputs.items()}
                    raise PipelineError(
                        entry.name,
                        f"pipeline {entry.name!r}: its warm-up on {shapes} failed: {exc}; give {entry.manifest} a "
                        "'warmup' sample its steps take",
                    ) from None

    def _ready(self, todo: list[Step], done: set[str], busy: set[str]) -> list[Step]:
        """Steps whose inputs are made and whose runner is free (a runner is one worker's: one call at a time)."""
        ready = []
        for step in todo:
            if step.after <= done and step.runner not in busy:
                ready.append(step)
                busy.add(step.runner)
        return ready if self._branches is not None else ready[:1]

    def close(self) -> None:
        if self._branches is not None:
            self._branches.shutdown(wait=False, cancel_futures=True)

    def _step(
        self, step: Step, values: Mapping[Ref, Value], rows: int, elements: int, keep: tuple[str, ...] | None
    ) -> dict[str, Value]:
        given = {param: values[ref] for param, ref in step.inputs}
        # A Python step may compute on threads of its own: priced by the wall.
        clock = price_clock(self._runners[step.model.name]) if step.model is not None else time.perf_counter_ns
        start = clock()
        try:
            made = self._call(step, given, keep)
        except StepFailed:
            raise
        except BaseException as exc:  # a Python step's SystemExit too: its request's failure, not its worker's end
            raise StepFailed(f"step {step.name!r} ({step.runs}) failed: {type(exc).__name__}: {exc}") from exc
        self._service.observe(step.key, clock() - start, rows, elements)
        return made

    def _call(self, step: Step, given: dict[str, Value], keep: tuple[str, ...] | None) -> dict[str, Value]:
        """`keep` None: the step runs as on the CPU, host arrays in and out; else (a step
        of the plan, `kept`) it may take DeviceTensors and leaves `keep` on the device."""
        model = step.model
        if model is None:
            assert step.function is not None
            return _checked(step, step.function(**given))  # never given a kept output (`_plan`)
        signature = model.signature
        # Nothing to run (a detector found nothing; a kept DeviceTensor has a shape too): empty outputs.
        if signature.batchable and any(array.shape[0] == 0 for array in given.values()):
            return {spec.name: np.zeros(_empty(spec.shape), DTYPES[spec.dtype]) for spec in step.outputs}
        if keep is not None:
            runner = cast(KeepsOnDevice, self._runners[model.name])
            on_device = {spec.name: _contiguous(given[spec.name]) for spec in signature.inputs}
            return named(signature.output_names, runner.run_keeping(on_device, signature.output_names, keep))
        inputs = {spec.name: np.ascontiguousarray(given[spec.name]) for spec in signature.inputs}
        return named(signature.output_names, self._runners[model.name].run(inputs, signature.output_names))


def _contiguous(value: Value) -> Value:
    """A host array as a runner takes it; a kept output as it is (the runner copies it on the device)."""
    return value if isinstance(value, DeviceTensor) else np.ascontiguousarray(value)


def _empty(shape: tuple[int, ...]) -> tuple[int, ...]:
    """No rows, and no elements along any other open dimension."""
    return (0, *(max(d, 0) for d in shape[1:]))


def _checked(step: Step, made: Any) -> dict[str, np.ndarray]:
    """A Python step's result, held to the manifest: its outputs, their dtypes, ranks and fixed sizes."""
    declared = {spec.name: spec for spec in step.outputs}
    if not isinstance(made, Mapping) or set(made) != set(declared):
        names = sorted(made) if isinstance(made, Mapping) else type(made).__name__
        raise StepFailed(f"step {step.name!r} ({step.runs}) returned {names}; it declares {sorted(declared)}")
    checked = {}
    for name, spec in declared.items():
        array = np.asarray(made[name])
        shape_ok = array.ndim == len(spec.shape) and all(d in (-1, n) for d, n in zip(spec.shape, array.shape))
        if array.dtype != DTYPES[spec.dtype] or not shape_ok:
            raise StepFailed(
                f"step {step.name!r} ({step.runs}) returned {name} as {array.dtype} {list(array.shape)}; "
                f"it declares {spec.dtype} {list(spec.shape)}"
            )
        checked[name] = array
    return checked


def width(pipelines: list[Pipeline]) -> int:
    """The most runners one wave of these pipelines uses at once: the threads a worker needs for branches."""
    return max((len({step.runner for step in wave}) for p in pipelines for wave in p.waves), default=1)
