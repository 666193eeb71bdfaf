"""A lane's worker: the thread that loads and warms the lane's models, then runs its jobs.

Expired jobs are answered, not run; the rest run alone or batched, each answered through the
lane's Answers. The worker keeps no figures of its own: it counts through the class's stats.
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
from edged.serve.answers import Answers
from edged.serve.lanes.batching import Job, fill, stack, unstack
from edged.serve.lanes.precedence import Precedence
from edged.serve.lanes.priced import StepLate
from edged.serve.lanes.steps import StepFailed, Stepper, width
from edged.serve.lanes.warming import WARMUP_RUNS, load_and_warm, time_calls
from edged.serve.lanes.watchdog import OpenCalls
from edged.serve.pricing import ServiceTimes, price_clock
from edged.wire.codec import Status

log = logging.getLogger("edged.lanes")

STOP = object()  # queued to end one worker once what is ahead of it is done


SHUTTING_DOWN = "the daemon is shutting down"


class Withdrawn(Exception):
    """A stop closed the lane's calls: the job is not to run (OpenCalls.close)."""


@dataclass(frozen=True, slots=True)
class Remeasure:
    """Ask a worker to re-time `model` (Lane.offer). `cost_ns` stays in the backlog until
    done, so arrivals meanwhile are admitted behind it."""

    model: ModelEntry
    cost_ns: int

    @classmethod
    def of(cls, model: ModelEntry, service: ServiceTimes) -> Remeasure:
        """A re-timing of `model`, charged the calls it makes at the model's price now."""
        calls = 1 if model.pipeline is not None else WARMUP_RUNS - 1
        return cls(model, service.estimate_ns(model.name) * calls)


@dataclass(slots=True)
class Worker:
    """One worker of a lane. Its own fields (`runners`, `stepper`, `error`, `loaded`) are
    written only by the thread that loads it, before it serves; the rest are shared."""

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
    stepper: Stepper | None = None
    error: BaseException | None = None  # why `load` failed
    loaded: threading.Event = field(default_factory=threading.Event)

    def load(self) -> None:
        """Pin the thread as the class asks, then load and warm the models on the thread that calls them."""
        # On Linux both apply to this thread only; the backend's threads, made from it, inherit them.
        if self.klass.cpu_affinity:
            os.sched_setaffinity(0, self.klass.cpu_affinity)
        if self.klass.nice:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.klass.nice)
        for model in self.models:
            self.runners[model.name] = load_and_warm(self.backend, model, self.klass, self.service)
        if self.pipelines:
            pipelines = [entry.pipeline for entry in self.pipelines if entry.pipeline is not None]
            # A GPU runtime's per-thread state (cuDNN handles, context) is this thread's: branches run here, in turn.
            on_gpu = isinstance(self.backend, Reserving)
            self.stepper = Stepper(self.runners, self.service, 1 if on_gpu else width(pipelines))
            for entry in self.pipelines:
                self.stepper.warm(entry)
        self.loaded.set()

    def serve(self) -> None:
        """Run jobs until STOP, or until the watchdog gives up on this thread."""
        holding = False
        me = threading.current_thread()
        while not self.calls.abandoned(me):
            job = self.calls.take_held() if holding else None
            if job is None:
                job = self.jobs.get()
            holding = False
            if job is STOP:
                break
            # A re-timing waits too: it computes as a call does, and is timed apart from the higher classes'.
            if self.klass.yields and not self._wait_turn(job):
                continue
            if isinstance(job, Remeasure):
                self._remeasure(job)
                continue
            batch = [job]
            if self.klass.max_batch > 1 and job.model.signature.batchable and job.model.pipeline is None:
                # max_batch counts rows, as GPU buffers are sized; a larger lone job (CPU only) runs alone.
                rows = min(self.klass.max_batch, self._row_cap(job))
                held = fill(batch, self.jobs, self.klass.max_batch, self.klass.batch_wait_us, rows)
                if held is not None:
                    self.calls.hold(held)
                    holding = True
            try:
                self.run(batch)
            except Exception as exc:  # a bug past the backend call must cost its batch, never the lane a worker
                self.calls.end()
                log.exception("class %s: a batch of %s failed", self.klass.name, job.model.name)
                self.answers.failures(batch, time.monotonic_ns(), f"the daemon failed on this request: {exc}")
            # Drop the jobs before blocking: their frames or mapped shared memory go now, not at the next job.
            job = batch = held = None
        self.close()

    def close(self) -> None:
        """Close what `load` opened (all of it, or what it had when it failed)."""
        for runner in self.runners.values():
            runner.close()
        if self.stepper is not None:
            self.stepper.close()

    def _wait_turn(self, job: Job | Remeasure) -> bool:
        """Wait while a higher class has work, holding `job` where a stop can take it
        (edged.daemon.stopping); False where one did: the job is answered, not for running."""
        self.calls.hold(job)
        self.precedence.wait_turn(self.klass.order)
        return self.calls.take_held() is not None

    def _remeasure(self, job: Remeasure) -> None:
        """Re-time a model, each backend call watched as any. Its charge leaves the backlog
        here, or, where the watchdog gave up on this thread meanwhile, it left with the watchdog."""

        def watch() -> None:
            if not self.calls.begin([], time.monotonic_ns(), job.cost_ns):
                raise Withdrawn

        model = job.model
        try:
            inputs = model.samples[0].inputs()
            if model.pipeline is None:
                elapsed = time_calls(self.runners[model.name], model, inputs, watch)
                self.service.observe(model.name, elapsed, 1, model.signature.elements(inputs))
            else:
                assert self.stepper is not None
                # Counted toward its bound: while slow runs there shed every request, these alone replace them.
                self.stepper.timed(model, inputs, lambda step, done: watch(), bounding=True)
        except Withdrawn:
            pass
        except StepFailed as exc:
            log.warning("pipeline %s: re-timing its warm-up sample failed: %s", model.name, exc)
        except Exception:  # a transient backend error: the price stands
            log.exception("class %s: re-timing %s failed", self.klass.name, model.name)
        finally:
            self.calls.end()
        if not self.calls.abandoned(threading.current_thread()):
            self.answers.done_unanswered(job.cost_ns)

    def _row_cap(self, job: Job) -> int:
        """Most rows one call may carry and end within max_call_ms (at least one: a job is never
        split). A size-priced model uses the job's own price: per-row averages mix every size."""
        cap_ns = (self.klass.max_call_ms or 0) * 1e6  # None: a class built by hand, never derived
        if not cap_ns:
            return sys.maxsize
        if job.model.signature.sized:
            row_ns = job.cost_ns / max(job.rows, 1)  # a request of 0 rows is valid, and its own batch
            return max(int(cap_ns // row_ns), 1) if row_ns > 0 else sys.maxsize
        name = job.model.name
        first_ns, extra_ns = self.service.estimate_ns(name, 1), self.service.extra_row_ns(name)
        return 1 + max(int((cap_ns - first_ns) // extra_ns), 0) if extra_ns > 0 else sys.maxsize

    def run(self, batch: list[Job]) -> None:
        """Run the batch's unexpired jobs in one backend call and answer each."""
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
        if not self.calls.begin(live, time.monotonic_ns()):
            for job in live:
                self.answers.unrun(job, Status.UNAVAILABLE, SHUTTING_DOWN)
            return
        inputs, names = stack(live)
        rows = sum(job.rows for job in live)
        self.answers.stats.call(rows)
        runner = self.runners[live[0].model.name]
        clock = price_clock(runner)
        start, priced_from = time.perf_counter_ns(), clock()
        try:
            results = unstack(live, names, runner.run(inputs, names))
        except Exception as exc:
            self.calls.end()
            if len(live) > 1:
                # Run each alone, so only the request that fails gets INTERNAL.
                log.warning(
                    "a batched call of %s failed; its %d jobs run alone: %s", live[0].model.name, len(live), exc
                )
                for job in live:
                    self.run([job])
                return
            self.answers.result(live[0], taken_ns, 0, error=f"the backend failed on this request: {exc}")
            log.warning("backend error on %s: %s", live[0].model.name, exc)
            return
        self.calls.end()
        compute_ns = time.perf_counter_ns() - start
        self.service.observe(live[0].model.name, clock() - priced_from, rows, sum(job.elements for job in live))
        for job, result in zip(live, results):
            self.answers.result(job, taken_ns, compute_ns, outputs=result)

    def _run_pipeline(self, job: Job, taken_ns: int) -> None:
        """Run a pipeline's steps, each watched as a backend call. Before each, a yielding class
        waits its turn, and the rest of the path must fit the deadline at admission's prices,
        or the request ends DEADLINE_EXCEEDED naming the late step. No step is cut mid-call."""
        pipeline, priced = job.model.pipeline, job.priced
        assert pipeline is not None and priced is not None and self.stepper is not None
        # From arrival where an idle worker woke for it: that hand-off is part of the run's cost.
        origin_ns = job.received_ns if job.wakes else taken_ns

        def before_step(step: Step, done: set[str]) -> None:
            if done and self.klass.yields:
                self.calls.end()  # waiting is no backend call: not the watchdog's to time
                if not self._wait_turn(job):
                    raise Withdrawn
            now_ns = time.monotonic_ns()
            if (late := priced.late(job.deadline_ns - now_ns, step)) is not None:
                # Count a cut run at its least cost: dropping it would hide the slow tail the bound must cover.
                at_least_ns = now_ns - origin_ns + priced.tails[step.name]
                self.service.observe_run(pipeline.name, at_least_ns, job.rows, job.elements)
                raise StepLate(late)
            if not self.calls.begin([job], now_ns):
                raise Withdrawn

        self.answers.stats.call(job.rows)
        start = time.perf_counter_ns()
        try:
            outputs = self.stepper.run(pipeline, job.inputs, job.rows, job.elements, before_step)
        except StepLate as exc:
            self.answers.expired(job, str(exc), ran=(taken_ns, time.perf_counter_ns() - start))
            return
        except Withdrawn:  # a stop closed the calls: UNAVAILABLE, unless the stop answered it already
            self.answers.unrun(job, Status.UNAVAILABLE, SHUTTING_DOWN)
            return
        except StepFailed as exc:
            self.answers.result(job, taken_ns, time.perf_counter_ns() - start, error=str(exc))
            log.warning("pipeline %s: %s", pipeline.name, exc)
            return
        finally:
            self.calls.end()
        compute_ns = time.perf_counter_ns() - start
        self.service.observe_run(pipeline.name, time.monotonic_ns() - origin_ns, job.rows, job.elements)
        self.answers.result(job, taken_ns, compute_ns, outputs={name: outputs[name] for name in job.output_names})
