"""Lanes: one per priority class, reserved at start-up, each with its own queue,
worker threads and backend runners.

A worker takes a job off its class's queue, answers it DEADLINE_EXCEEDED if its
deadline passed while queued (it is not run), batches only what the class allows,
runs the backend and hands each reply to the `reply` callback it was given: a
lane never touches a socket.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from edged.backends import Backend, Runner
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry
from edged.serve.admission import Backlog, ServiceTimes
from edged.serve.answers import Answers, ReplyFn
from edged.serve.batching import Job, fill, stack, unstack, zero_inputs
from edged.serve.stats import ClassStats
from edged.serve.watchdog import OpenCalls
from edged.wire.codec import Status

log = logging.getLogger("edged.lanes")

WARMUP_RUNS = 5
REMEASURE_EVERY_NS = 1_000_000_000
INLINE_OVERSHOOT = 4  # an inline run this many times over the limit disqualifies its model


_STOP = object()


@dataclass(frozen=True, slots=True)
class _Remeasure:
    """Ask a worker to time the model afresh (see Lane.remeasure)."""

    model: ModelEntry


class Lane:
    def __init__(
        self,
        klass: ClassConfig,
        models: list[ModelEntry],
        backend: Backend,
        reply: ReplyFn,
        stats: ClassStats | None = None,
    ) -> None:
        self.klass = klass
        self.models = models
        self.stats = stats or ClassStats()
        self.backlog = Backlog()
        self.service = ServiceTimes()
        self._backend = backend
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._ready = threading.Barrier(klass.workers + 1)
        self._load_errors: list[BaseException] = []
        self._shared_runners: dict[str, Runner] = {}
        self._not_inline: set[str] = set()
        self._last_remeasure_ns = 0
        self._calls = OpenCalls()
        self._answers = Answers(reply, self.stats, self.backlog)
        self.health = "ok"  # or why not: shown by the health op

    # --- life cycle --------------------------------------------------------

    def start(self) -> None:
        """Start the workers; returns once each has loaded and warmed every model."""
        for _ in range(self.klass.workers):
            self._start_worker(self._ready)
        self._ready.wait()
        if self._load_errors:
            self.stop(timeout_s=1.0)
            raise self._load_errors[0]

    def submit(self, job: Job) -> None:
        """Queue an admitted job (socket loop only)."""
        self.backlog.add(job.cost_ns)
        self._queue.put(job)

    def run_inline(self, job: Job) -> bool:
        """Run a cheap job on the caller's (the socket loop's) thread when the lane is idle.

        Two thread handoffs (to a worker and back) cost more than a model of a few
        tens of microseconds takes to run. A class with `inline_max_us` set runs such
        jobs at once instead, which delays the loop's next request by about that
        long; a lane with work queued or running never does, so order is kept.
        A model whose run overshoots its estimate by far (its cost depends on the
        values it is given, say) is never run inline again on this lane.
        """
        limit_ns = self.klass.inline_max_us * 1000
        if (
            job.cost_ns > limit_ns
            or self.backlog.depth
            or not self._shared_runners
            or job.model.name in self._not_inline
        ):
            return False
        self.backlog.add(job.cost_ns)
        # CPU time of this thread, not wall time: being preempted once by another
        # process must not disqualify a model that is cheap.
        start = time.thread_time_ns()
        # ONNX Runtime and TensorRT runners take concurrent calls, so a worker's serves here too.
        self._run([job], self._shared_runners[job.model.name])
        elapsed_ns = time.thread_time_ns() - start
        if elapsed_ns > INLINE_OVERSHOOT * limit_ns:
            self._not_inline.add(job.model.name)
            log.warning(
                "%s took %.1f ms of CPU on the socket loop, past classes.%s.inline_max_us; "
                "it now always runs on the lane",
                job.model.name,
                elapsed_ns / 1e6,
                self.klass.name,
            )
        return True

    def remeasure(self, model: ModelEntry, now_ns: int) -> None:
        """Refresh the model's service estimate on an idle lane, at most once a second.

        Called when admission sheds a request as too slow for its deadline: were the
        estimate stale (inflated by a burst of contention, say), it would shed those
        requests forever, since nothing admitted would ever measure it again.
        """
        if self.backlog.depth == 0 and now_ns - self._last_remeasure_ns > REMEASURE_EVERY_NS:
            self._last_remeasure_ns = now_ns
            self._queue.put(_Remeasure(model))

    def reject_queued(self, message: str) -> int:
        """Answer every job still queued UNAVAILABLE, without running it."""
        count = 0
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return count
            if job is _STOP:
                self._queue.put(job)
                return count
            if isinstance(job, Job):
                self._answers.unrun(job, Status.UNAVAILABLE, message)
            count += 1

    def retire(self) -> None:
        """Let the workers finish every job already queued, then end."""
        for _ in self._workers():
            self._queue.put(_STOP)

    @property
    def alive(self) -> bool:
        return any(thread.is_alive() for thread in self._workers())

    def stop(self, timeout_s: float) -> None:
        """Retire, and wait up to `timeout_s` for the workers to end."""
        self.retire()
        end = time.monotonic() + timeout_s
        for thread in self._workers():
            thread.join(max(end - time.monotonic(), 0.0))

    def check_stuck(self, now_ns: int) -> None:
        """Answer the requests of a backend call open past `stuck_after_ms`, and
        replace its worker (socket loop only, from its periodic tick)."""
        limit_ms = self.klass.stuck_after_ms
        stuck = self._calls.overdue(now_ns, limit_ms * 1_000_000) if limit_ms else []
        if not stuck:
            return
        self._answers.failures(
            stuck, now_ns, f"the backend call has not returned after {limit_ms} ms; the lane is restarting its worker"
        )
        self.health = f"recovering: a backend call of {stuck[0].model.name} has not returned after {limit_ms} ms"
        log.error("class %s: %s; starting a new worker", self.klass.name, self.health)
        self._start_worker(None)

    def answer_open_calls(self, message: str) -> int:
        """Answer INTERNAL every request still inside a backend call: the last act of a
        shutdown whose grace ran out, so that nothing admitted goes unanswered."""
        now_ns = time.monotonic_ns()
        return self._answers.failures(self._calls.overdue(now_ns, -1), now_ns, message)

    def _workers(self) -> list[threading.Thread]:
        return [thread for thread in self._threads if not self._calls.abandoned(thread)]

    def _start_worker(self, ready: threading.Barrier | None) -> None:
        name = f"lane-{self.klass.name}-{len(self._threads)}"
        thread = threading.Thread(target=self._work, args=(ready,), name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # --- the worker --------------------------------------------------------

    def _work(self, ready: threading.Barrier | None) -> None:
        """A worker's life; `ready` is start-up's barrier, None for a replacement."""
        runners: dict[str, Runner] = {}
        try:
            self._reserve_thread()
            for model in self.models:
                runners[model.name] = self._backend.load(model, self.klass)
                self._warm(model, runners[model.name])
        except BaseException as exc:
            if ready is None:
                log.error("class %s: the replacement worker failed to load: %s", self.klass.name, exc)
                return
            self._load_errors.append(exc)  # reported by start(), on the caller's thread
            ready.wait()
            return
        self._shared_runners = self._shared_runners or runners
        if ready is None:
            self.health = "ok"
            log.info("class %s: a new worker serves", self.klass.name)
        else:
            ready.wait()
        held: Job | None = None
        me = threading.current_thread()
        while not self._calls.abandoned(me):
            job = held if held is not None else self._queue.get()
            held = None
            if job is _STOP:
                break
            if isinstance(job, _Remeasure):
                self._measure(job.model, runners[job.model.name], rows=1, runs=1)
                continue
            batch = [job]
            if self.klass.max_batch > 1 and job.model.signature.batchable:
                held = fill(batch, self._queue, self.klass.max_batch, self.klass.batch_wait_us)
            self._run(batch, runners[job.model.name])
        for runner in runners.values():
            runner.close()

    def _reserve_thread(self) -> None:
        # Both apply to the calling thread on Linux, and the backend's own
        # threads, created from this one, inherit them.
        if self.klass.cpu_affinity:
            os.sched_setaffinity(0, self.klass.cpu_affinity)
        if self.klass.nice:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.klass.nice)

    def _warm(self, model: ModelEntry, runner: Runner) -> None:
        """Run the model at batch 1 and at the class's largest batch before serving."""
        for rows in sorted({1, self.klass.max_batch if model.signature.batchable else 1}):
            self._measure(model, runner, rows, WARMUP_RUNS)

    def _measure(self, model: ModelEntry, runner: Runner, rows: int, runs: int) -> None:
        """Time `runs` calls on zeros of `rows` rows; the last one feeds the service estimate."""
        inputs = zero_inputs(model, rows)
        for _ in range(runs):
            start = time.perf_counter_ns()
            runner.run(inputs, model.signature.output_names)
            elapsed = time.perf_counter_ns() - start
        self.service.observe(model.name, elapsed, rows)

    def _run(self, batch: list[Job], runner: Runner) -> None:
        taken_ns = time.monotonic_ns()
        live = []
        for job in batch:
            if taken_ns > job.deadline_ns:
                self.stats.report_expired()
                self._answers.unrun(
                    job, Status.DEADLINE_EXCEEDED, "its deadline passed while it was queued; it was not run"
                )
            else:
                live.append(job)
        if not live:
            return
        inputs, names = stack(live)
        rows = sum(job.rows for job in live)
        self.stats.report_call(rows)
        start = time.perf_counter_ns()
        self._calls.begin(live, time.monotonic_ns())
        try:
            outputs = runner.run(inputs, names)
        except Exception as exc:
            self._calls.end()
            if len(live) > 1:
                # Run each alone, so only the request that fails gets INTERNAL.
                for job in live:
                    self._run([job], runner)
                return
            self._answers.result(live[0], taken_ns, 0, error=f"the backend failed on this request: {exc}")
            log.warning("backend error on %s: %s", live[0].model.name, exc)
            return
        self._calls.end()
        compute_ns = time.perf_counter_ns() - start
        self.service.observe(live[0].model.name, compute_ns, rows)
        for job, result in zip(live, unstack(live, names, outputs)):
            self._answers.result(job, taken_ns, compute_ns, outputs=result)
