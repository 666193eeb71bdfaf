"""A lane's worker: the thread that runs its class's jobs on the backend.

It loads and warms every model of the lane, then takes jobs off the lane's queue:
a job whose deadline passed while it waited is answered DEADLINE_EXCEEDED and not
run; the rest run alone or, where the class allows, batched with what waits beside
them. Each result goes to the lane's Answers, which hands the reply to the loop that
owns the request's socket, to send (edged.serve.transport). The worker writes no
figure of the lane's own: it counts through the class's stats, under their lock.

A class that yields waits for its turn before each call, and sizes the call's batch
to its cap (edged.serve.lanes.precedence).
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from edged.backends import Backend, Reserving, Runner
from edged.config.classes import ClassConfig
from edged.models.pipeline import Step
from edged.models.repository import ModelEntry
from edged.models.warmup import load_failure, tiled, warmup_failure
from edged.serve.answers import Answers
from edged.serve.lanes.batching import Job, fill, stack, unstack
from edged.serve.lanes.precedence import Precedence
from edged.serve.lanes.priced import StepLate
from edged.serve.lanes.steps import StepFailed, Stepper, width
from edged.serve.lanes.watchdog import OpenCalls
from edged.serve.pricing import ServiceTimes, price_clock

log = logging.getLogger("edged.lanes")

WARMUP_RUNS = 5

STOP = object()  # queued to end one worker once what is ahead of it is done


@dataclass(frozen=True, slots=True)
class Remeasure:
    """Ask a worker to time the model afresh (see Lane.offer): work of `cost_ns` in the
    lane's backlog until done, so that what arrives meanwhile is admitted behind it."""

    model: ModelEntry
    cost_ns: int


@dataclass(slots=True)
class Worker:
    """One worker of a lane, with what it shares with the lane's other workers.

    Its own fields (`runners`, `error`, `loaded`) are written by its thread only, in
    `load` (or, for `error`, when `load` fails), before it serves.
    """

    klass: ClassConfig
    models: list[ModelEntry]
    backend: Backend
    jobs: queue.SimpleQueue[Any]
    calls: OpenCalls
    answers: Answers
    service: ServiceTimes
    precedence: Precedence
    pipelines: list[ModelEntry] = field(default_factory=list)  # run on workers alone, never on the loop
    runners: dict[str, Runner] = field(default_factory=dict)
    stepper: Stepper | None = None  # the pipelines' steps (edged.serve.lanes.steps)
    error: BaseException | None = None  # why `load` failed
    loaded: threading.Event = field(default_factory=threading.Event)

    def load(self, pin: bool = True) -> None:
        """Pin the thread as the class asks (unless `pin` is false), then load and warm
        each model, on the thread that will call the runners."""
        # Both apply to the calling thread on Linux, and the backend's own
        # threads, created from this one, inherit them.
        if pin and self.klass.cpu_affinity:
            os.sched_setaffinity(0, self.klass.cpu_affinity)
        if pin and self.klass.nice:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.klass.nice)
        for model in self.models:
            self.runners[model.name] = load_and_warm(self.backend, model, self.klass, self.service)
        if self.pipelines:
            pipelines = [entry.pipeline for entry in self.pipelines if entry.pipeline is not None]
            # A GPU runtime keeps per-thread state (ONNX Runtime's cuBLAS and cuDNN handles,
            # the current context), made on this thread: there, branches run here, in turn.
            on_gpu = isinstance(self.backend, Reserving)
            self.stepper = Stepper(self.runners, self.service, 1 if on_gpu else width(pipelines))
            for entry in self.pipelines:
                self.stepper.warm(entry, WARMUP_RUNS)
        self.loaded.set()

    def serve(self) -> None:
        """Run jobs until STOP, or until the watchdog gives up on this thread."""
        held: Job | None = None
        me = threading.current_thread()
        while not self.calls.abandoned(me):
            job = held if held is not None else self.jobs.get()
            held = None
            if job is STOP:
                break
            if isinstance(job, Remeasure):
                self._remeasure(job.model)
                self.answers.done_unanswered(job.cost_ns)
                continue
            if self.klass.yields:
                self.precedence.wait_turn(self.klass.order)
            batch = [job]
            if self.klass.max_batch > 1 and job.model.signature.batchable and job.model.pipeline is None:
                # max_batch counts rows: a GPU backend's buffers hold that many. A lone job
                # past it still runs, alone, where the backend took it (the CPU's).
                rows = min(self.klass.max_batch, self._row_cap(job))
                held = fill(batch, self.jobs, self.klass.max_batch, self.klass.batch_wait_us, rows)
            self.run(batch)
            # Let go before waiting for the next: an answered request's inputs (its frames,
            # or the client's shared memory they keep mapped) go now, not when the next comes.
            job = batch = None
        for runner in self.runners.values():
            runner.close()
        if self.stepper is not None:
            self.stepper.close()

    def _remeasure(self, model: ModelEntry) -> None:
        inputs = model.samples[0].inputs()
        if model.pipeline is None:
            elapsed = _time_calls(self.runners[model.name], model, inputs, 1)
            self.service.observe(model.name, elapsed, 1, model.signature.elements(inputs))
            return
        assert self.stepper is not None
        try:
            self.stepper.timed(model, inputs)
        except StepFailed as exc:
            log.warning("pipeline %s: re-timing its warm-up sample failed: %s", model.name, exc)

    def _row_cap(self, job: Job) -> int:
        """The most rows of `job`'s model one call may carry and still end within the
        class's max_call_ms, by the lane's estimate (at least one: a job is never split).
        A size-priced model's rows cost what the job's own price says: the lane's per-row
        averages mix every size it has seen."""
        cap_ns = (self.klass.max_call_ms or 0) * 1e6  # None: a class built by hand, never derived
        if not cap_ns:
            return sys.maxsize
        if job.model.signature.sized:
            row_ns = job.cost_ns / job.rows
            return max(int(cap_ns // row_ns), 1) if row_ns > 0 else sys.maxsize
        name = job.model.name
        first_ns, extra_ns = self.service.estimate_ns(name, 1), self.service.extra_row_ns(name)
        return 1 + max(int((cap_ns - first_ns) // extra_ns), 0) if extra_ns > 0 else sys.maxsize

    def run(self, batch: list[Job]) -> None:
        """Run the batch's live jobs in one backend call and answer each of them; a job
        whose deadline passed while it waited is answered, not run."""
        taken_ns = time.monotonic_ns()
        live = []
        for job in batch:
            if taken_ns > job.deadline_ns:
                self.answers.expired(job)
            else:
                live.append(job)
        if not live:
            return
        if live[0].model.pipeline is not None:
            self._run_pipeline(live[0], taken_ns)
            return
        inputs, names = stack(live)
        rows = sum(job.rows for job in live)
        self.answers.stats.call(rows)
        runner = self.runners[live[0].model.name]
        clock = price_clock(runner)
        start, priced_from = time.perf_counter_ns(), clock()
        self.calls.begin(live, time.monotonic_ns())
        try:
            outputs = runner.run(inputs, names)
        except Exception as exc:
            self.calls.end()
            if len(live) > 1:
                # Run each alone, so only the request that fails gets INTERNAL.
                for job in live:
                    self.run([job])
                return
            self.answers.result(live[0], taken_ns, 0, error=f"the backend failed on this request: {exc}")
            log.warning("backend error on %s: %s", live[0].model.name, exc)
            return
        self.calls.end()
        compute_ns = time.perf_counter_ns() - start
        self.service.observe(live[0].model.name, clock() - priced_from, rows, sum(job.elements for job in live))
        for job, result in zip(live, unstack(live, names, outputs)):
            self.answers.result(job, taken_ns, compute_ns, outputs=result)

    def _run_pipeline(self, job: Job, taken_ns: int) -> None:
        """A pipeline's steps (edged.serve.lanes.steps), watched as one backend call that
        starts afresh with each step. Before each step, a class that yields waits its turn,
        and the path from that step to the end must still fit the deadline by the steps'
        prices as admission took them, or the request ends DEADLINE_EXCEEDED, naming the
        step that would end late. Steps are not cancelled mid-call."""
        pipeline, priced = job.model.pipeline, job.priced
        assert pipeline is not None and priced is not None and self.stepper is not None
        # Its price is what the run cost the request: from its arrival where a waiting
        # worker had to wake for it (the hand-off, which a busy worker does not need), the
        # steps, the bookkeeping between them and the join.
        origin_ns = job.received_ns if job.wakes else taken_ns

        def before_step(step: Step, done: set[str]) -> None:
            if done and self.klass.yields:
                self.precedence.wait_turn(self.klass.order)
            now_ns = time.monotonic_ns()
            if (late := priced.late(job.deadline_ns - now_ns, step)) is not None:
                # A run cut short counts at what it would have cost at least: left out, the
                # slow runs a deadline cuts would hide the very tail the bound keeps in hand.
                at_least_ns = now_ns - origin_ns + priced.tails[step.name]
                self.service.observe_run(pipeline.name, at_least_ns, job.rows, job.elements)
                raise StepLate(late)
            self.calls.begin([job], now_ns)

        self.answers.stats.call(job.rows)
        start = time.perf_counter_ns()
        try:
            outputs = self.stepper.run(pipeline, job.inputs, job.rows, job.elements, before_step)
        except StepLate as exc:
            self.answers.expired(job, str(exc), ran=(taken_ns, time.perf_counter_ns() - start))
            return
        except StepFailed as exc:
            self.answers.result(job, taken_ns, 0, error=str(exc))
            log.warning("pipeline %s: %s", pipeline.name, exc)
            return
        finally:
            self.calls.end()
        compute_ns = time.perf_counter_ns() - start
        self.service.observe_run(pipeline.name, time.monotonic_ns() - origin_ns, job.rows, job.elements)
        self.answers.result(job, taken_ns, compute_ns, outputs={name: outputs[name] for name in job.output_names})


def load_and_warm(backend: Backend, model: ModelEntry, klass: ClassConfig, service: ServiceTimes) -> Runner:
    """Load `model` for `klass` and make WARMUP_RUNS calls on each warm-up sample (and at the
    class's largest batch), seeding `service` with the median of all but the first; a failure
    says which model, on what, and the fix."""
    try:
        runner = backend.load(model, klass)
    except Exception as exc:
        raise load_failure(model.name, model.variant.path, exc) from exc
    for sample in model.samples:
        for inputs, rows in tiled(sample, model.signature, klass.max_batch):
            try:
                runner.run(inputs, model.signature.output_names)  # warms the runtime up: not timed
                elapsed = _time_calls(runner, model, inputs, WARMUP_RUNS - 1)
            except Exception as exc:
                runner.close()
                given = bool(model.warmup)
                raise warmup_failure(model.name, model.signature, sample, model.manifest, given, exc) from exc
            service.observe(model.name, elapsed, rows, model.signature.elements(inputs))
    return runner


def _time_calls(runner: Runner, model: ModelEntry, inputs: dict[str, Any], runs: int) -> int:
    """The median time of `runs` calls on `inputs`, by the runner's price clock: a single
    call would carry any hiccup of the box into the price."""
    clock, times = price_clock(runner), []
    for _ in range(runs):
        start = clock()
        runner.run(inputs, model.signature.output_names)
        times.append(clock() - start)
    return sorted(times)[len(times) // 2]
