"""The inline path: a job estimated as tiny runs on the socket loop itself; on an idle
lane, a dearer one runs on the loop's thread too, with a stand-in on the sockets.

Two thread hand-offs (to a worker and back) cost more than a model of a few tens of
microseconds takes to run, so a class with `inline_max_us` set runs such jobs at
once, on the loop, when its lane is idle. That delays the loop's next request by
about as long, so a model whose inline runs overrun by far (its cost follows the
values it is given, say) is taken off the loop. One slow run is not enough: a first
call on a fresh thread, a page fault or a preemption can cost milliseconds once.
A request of a size-priced model larger than any size measured on the lane has a
guessed price: it runs on the lane, which measures it, and never here until then.

A job over the limit, on an idle lane, is handed to no worker: the loop's thread runs
it aside (`run_aside`, through edged.serve.lanes.routes.Aside), as a worker would run it
(deadline, watchdog, precedence), while the stand-in serves whatever arrives meanwhile. The hand-off
to a sleeping worker costs more than the heavy model's whole overhead target
(docs/benchmarks.md); `classes.NAME.stand_in = false` keeps such jobs on the workers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from edged.backends import computes_on_caller
from edged.config.classes import ClassConfig
from edged.serve.lanes.batching import Job
from edged.serve.lanes.worker import WARMUP_RUNS, Worker

log = logging.getLogger("edged.lanes")

OVERSHOOT = 4  # an inline run this many times over the limit is an overrun
STRIKES = 3  # this many overruns ...
WITHIN_RUNS = 64  # ... within this many inline runs of the model take it off the loop
# Admissions estimated under the limit that bring a model back, doubled each time it is taken off.
REQUALIFY_AFTER = 100


@dataclass(slots=True)
class _Standing:
    """One model's record on the inline path."""

    runs: int = 0
    overruns: deque[int] = field(default_factory=lambda: deque(maxlen=STRIKES))  # run numbers of recent overruns
    barred: bool = False
    times_barred: int = 0
    clean: int = 0  # admissions estimated under the limit since it was barred


class InlinePath:
    """A lane's inline path, with runners of its own: a worker that is loaded for the
    socket loop (on the loader's thread, before the lane serves) and never started.

    Owned by the socket loop: from the first request on, only the loop calls
    `qualifies` and `run` and writes the standings; the runners are never shared with a lane worker, so
    a worker that the watchdog replaces takes nothing of the loop's with it.
    """

    def __init__(self, klass: ClassConfig, worker: Worker) -> None:
        self._klass = klass
        self._worker = worker
        self._limit_ns = (klass.inline_max_us or 0) * 1000  # None only before resolve_loop_work
        self._standing: dict[str, _Standing] = {model.name: _Standing() for model in worker.models}
        self._thread: int | None = None  # the loop's, which warmed the runners: the only one to call them

    @property
    def on_loop_thread(self) -> bool:
        """Whether the calling thread is the one whose runners these are: the loop's, not
        the stand-in (any thread, for a lane no loop has warmed: one driven by hand)."""
        return self._thread is None or threading.get_ident() == self._thread

    def qualifies(self, job: Job) -> bool:
        """Whether `job` may run here (its lane must be idle too, and the caller on the
        thread `on_loop_thread` names); counts towards a barred model's return."""
        standing = self._standing[job.model.name]
        # A size past those measured is priced by extrapolation: it runs on the lane, and is measured there.
        cheap = job.cost_ns <= self._limit_ns and self._worker.service.measured(job.model.name, job.rows, job.elements)
        if standing.barred:
            standing.clean = standing.clean + 1 if cheap else 0
            if standing.clean < REQUALIFY_AFTER << (standing.times_barred - 1):
                return False
            standing.barred = False
            standing.overruns.clear()
            log.info("%s runs on the socket loop again (class %s)", job.model.name, self._klass.name)
        return cheap

    def run(self, job: Job) -> None:
        """Run a job that qualifies, here and now, and answer it.

        The lean version of a worker's call: a job just admitted on an idle lane cannot
        have expired, is never batched, and is never seen by the watchdog (which runs
        on this thread), so none of that machinery is needed here."""
        worker = self._worker
        name, rows = job.model.name, job.rows
        # CPU time of this thread, not wall time: being preempted by another process
        # is not the model's cost.
        cpu_ns = time.thread_time_ns()
        start_ns = time.monotonic_ns()
        outputs, error = None, None
        worker.answers.stats.call(rows)
        try:
            outputs = dict(zip(job.output_names, worker.runners[name].run(job.inputs, job.output_names)))
        except Exception as exc:
            error = f"the backend failed on this request: {exc}"
            log.warning("backend error on %s: %s", name, exc)
        end_ns = time.monotonic_ns()
        cpu_ns = time.thread_time_ns() - cpu_ns
        worker.answers.result(job, start_ns, end_ns - start_ns, outputs=outputs, error=error)
        if error is None:
            price_ns = cpu_ns if computes_on_caller(worker.runners[name]) else end_ns - start_ns
            worker.service.observe(name, price_ns, rows, job.elements)
        standing = self._standing[name]
        standing.runs += 1
        if cpu_ns > OVERSHOOT * self._limit_ns:
            self._overran(job, standing, cpu_ns)

    def run_aside(self, job: Job) -> None:
        """Run a job too dear to run inline, on this thread, as a worker would (the
        loop runs it aside: edged.serve.transport.server), and answer it."""
        self._worker.run([job])

    def _overran(self, job: Job, standing: _Standing, elapsed_ns: int) -> None:
        standing.overruns.append(standing.runs)
        if len(standing.overruns) < STRIKES or standing.runs - standing.overruns[0] >= WITHIN_RUNS:
            return
        standing.barred = True
        standing.times_barred += 1
        standing.clean = 0
        log.warning(
            "%s took %.1f ms of CPU on the socket loop, its %d overruns of classes.%s.inline_max_us within %d runs; "
            "it runs off the socket loop, on the lane, until %d requests in a row look cheap",
            job.model.name,
            elapsed_ns / 1e6,
            STRIKES,
            self._klass.name,
            WITHIN_RUNS,
            REQUALIFY_AFTER << (standing.times_barred - 1),
        )

    def warm(self) -> None:
        """Call each model that may run here a few times, on the calling thread (the
        loop's, before it serves), which becomes the only one to call them; a model priced
        over the limit is left cold unless it may run here aside (`stand_in`)."""
        self._thread = threading.get_ident()
        for model in self._worker.models:
            if not self._klass.stand_in and self._worker.service.estimate_ns(model.name) > self._limit_ns:
                continue
            inputs = model.samples[0].inputs()
            for _ in range(WARMUP_RUNS):
                self._worker.runners[model.name].run(inputs, model.signature.output_names)

    def close(self) -> None:
        for runner in self._worker.runners.values():
            runner.close()
        self._worker.runners.clear()
