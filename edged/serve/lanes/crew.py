"""A lane's workers: their threads, their queue, and their open backend calls, which the
watchdog reads. A worker the watchdog gives up on is answered for and replaced here."""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from typing import Any

from edged.backends import Backend
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry
from edged.serve.answers import Answers
from edged.serve.lanes.batching import Job
from edged.serve.lanes.precedence import Precedence
from edged.serve.lanes.watchdog import OpenCalls, Overdue
from edged.serve.lanes.worker import STOP, Remeasure, Worker
from edged.serve.pricing import ServiceTimes
from edged.threads import NamedThread
from edged.wire.codec import Status

log = logging.getLogger("edged.lanes")

# A replacement worker that failed to load (the hung call may still hold the device's memory)
# is tried again this often; meanwhile a lane left with no worker answers its queue UNAVAILABLE
# every ANSWER_EVERY_NS: admitted, nothing would run it.
RETRY_LOAD_NS = 2_000_000_000
ANSWER_EVERY_NS = 50_000_000


class Crew:
    """One lane's workers: written by the loader as it starts them, then by the steering
    thread alone. The workers take `jobs` and keep their open calls in `calls`, nothing else."""

    def __init__(
        self,
        klass: ClassConfig,
        models: list[ModelEntry],
        pipelines: list[ModelEntry],
        backend: Backend,
        answers: Answers,
        service: ServiceTimes,
        precedence: Precedence,
    ) -> None:
        self.klass = klass
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.calls = OpenCalls()
        self._models = models
        self._pipelines = pipelines
        self._backend = backend
        self._answers = answers
        self._service = service
        self._precedence = precedence
        self._threads: list[threading.Thread] = []
        self._started = 0  # threads started: each one's number in its name
        self._recovery = ""  # why the lane is not ok while `_replacements` are not all serving
        self._replacements: list[Worker] = []  # started for workers given up on
        self._retry_at_ns = 0  # when to try again the replacements that failed to load

    def start(self) -> None:
        """Start the workers; returns once each has loaded and warmed every model."""
        ready = threading.Barrier(self.klass.workers + 1)
        workers = [self._start_worker(ready) for _ in range(self.klass.workers)]
        ready.wait()
        errors = [worker.error for worker in workers if worker.error is not None]
        if errors:
            self.stop(1.0)
            raise errors[0]

    @property
    def health(self) -> str:
        """ "ok", or why not: shown by the health op."""
        if all(worker.loaded.is_set() for worker in self._replacements):
            return "ok"
        if failed := [worker.error for worker in self._replacements if worker.error is not None]:
            return f"{self._recovery}; {len(failed)} new worker(s) failed to load ({failed[0]}), retrying"
        return self._recovery

    @property
    def warming(self) -> bool:
        """Whether a replacement worker is loading its models and timing their prices."""
        return any(not worker.loaded.is_set() and worker.error is None for worker in self._replacements)

    def reject_queued(self, message: str) -> int:
        """Answer every job still queued UNAVAILABLE, without running it; a STOP stays queued."""
        count = stops = 0
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is STOP:
                stops += 1
            elif isinstance(job, Job):
                count += self._answers.unrun(job, Status.UNAVAILABLE, message)
            elif isinstance(job, Remeasure):  # a re-timing nobody waits for: dropped, off the backlog
                self._answers.done_unanswered(job.cost_ns)
        for _ in range(stops):
            self.jobs.put(STOP)
        return count

    def retire(self) -> None:
        """Let the workers finish every job already queued, then end."""
        for _ in self._workers():
            self.jobs.put(STOP)

    @property
    def alive(self) -> bool:
        return any(thread.is_alive() for thread in self._workers())

    def stop(self, timeout_s: float) -> None:
        """Retire, and wait up to `timeout_s` for the workers to end."""
        self.retire()
        end = time.monotonic() + timeout_s
        for thread in self._workers():
            thread.join(max(end - time.monotonic(), 0.0))

    def check_stuck(self, now_ns: int, replace: bool = True) -> None:
        """Answer the requests of a call open past `stuck_after_ms`; replace its worker, and try
        again a replacement that failed to load. A retired lane's (`replace` False) is given up
        on and not replaced: its other workers, if any, finish what it holds."""
        if replace:
            self._check_replacement(now_ns)
        limit_ms = self.klass.stuck_after_ms
        stuck = self.calls.overdue(now_ns, limit_ms * 1_000_000) if limit_ms else None
        if stuck is None or not stuck.workers_lost:
            return
        self._take_over(stuck)
        late = f"has not returned after {limit_ms} ms"
        why = f"a backend call {f'of {stuck.jobs[0].model.name}' if stuck.jobs else 're-timing a model'} {late}"
        if not replace:
            log.error("class %s: %s, on lanes a reload replaced: its worker is given up", self.klass.name, why)
            self._answers.failures(stuck.jobs, now_ns, f"the backend call {late}")
            return
        log.error("class %s: recovering: %s; starting a new worker", self.klass.name, why)
        # Recovering before the replies say so: a client told so may ask health at once.
        self._recovery = f"recovering: {why}"
        waiting = [worker for worker in self._replacements if not worker.loaded.is_set()]
        self._replacements = waiting + [self._start_worker(None) for _ in range(stuck.workers_lost)]
        self._retry_at_ns = now_ns + RETRY_LOAD_NS
        self._answers.failures(stuck.jobs, now_ns, f"the backend call {late}; the lane is restarting its worker")

    def next_check_ns(self, now_ns: int) -> float:
        """When `check_stuck` must look next: as the oldest open call passes `stuck_after_ms`,
        or soon, where a replacement failed to load."""
        limit_ms = self.klass.stuck_after_ms
        due = self.calls.oldest_ns(now_ns) + limit_ms * 1_000_000 if limit_ms else math.inf
        return min(due, now_ns + ANSWER_EVERY_NS) if self._failed_replacement() else due

    def _failed_replacement(self) -> bool:
        return any(worker.error is not None for worker in self._replacements)

    def _check_replacement(self, now_ns: int) -> None:
        if not self._failed_replacement():
            return
        if not self.alive:
            self.reject_queued(f"the class {self.klass.name!r} has no worker now: {self.health}")
        if now_ns >= self._retry_at_ns:
            self._replacements = [
                self._start_worker(None) if worker.error is not None else worker for worker in self._replacements
            ]
            self._retry_at_ns = now_ns + RETRY_LOAD_NS

    def answer_open_calls(self, message: str) -> int:
        """Answer INTERNAL every request still inside a backend call, and queue again what
        their threads held back (for reject_queued): the last acts of a shutdown whose grace
        ran out, so that nothing admitted goes unanswered."""
        now_ns = time.monotonic_ns()
        stuck = self.calls.overdue(now_ns, -1)
        self._take_over(stuck)
        return self._answers.failures(stuck.jobs, now_ns, message)

    def close_calls(self) -> None:
        """A stop whose grace ran out: no backend call begins from now on (a worker answers
        what it takes UNAVAILABLE), and what the workers hold is queued again for
        reject_queued. Before any call is answered: an answer may end a wait."""
        for item in self.calls.close():
            self.jobs.put(item)

    def _take_over(self, stuck: Overdue) -> None:
        """What threads given up on left: what they held back, queued again for the others;
        their re-timings' charges, off the backlog (such a thread settles none when it returns)."""
        for item in stuck.held:
            self.jobs.put(item)
        for charge_ns in stuck.retimings:
            self._answers.done_unanswered(charge_ns)

    def _workers(self) -> list[threading.Thread]:
        return [thread for thread in self._threads if not self.calls.abandoned(thread)]

    def _start_worker(self, ready: threading.Barrier | None) -> Worker:
        worker = Worker(
            self.klass,
            self._models,
            self._backend,
            self.jobs,
            self.calls,
            self._answers,
            self._service,
            self._precedence,
            pipelines=self._pipelines,
        )
        name = f"lane-{self.klass.name}-{self._started}"
        self._started += 1
        thread = NamedThread(target=self._work, args=(worker, ready), name=name, daemon=True)
        thread.start()
        # Threads that ended (a failed load, a worker given up on that returned) need no STOP, nor a join.
        self._threads = [*(thread for thread in self._threads if thread.is_alive()), thread]
        return worker

    def _work(self, worker: Worker, ready: threading.Barrier | None) -> None:
        """A worker's life; `ready` is start-up's barrier, None for a replacement."""
        try:
            worker.load()
        except BaseException as exc:
            worker.error = exc  # reported by start(), on the caller's thread
            try:
                worker.close()  # a retry every RETRY_LOAD_NS would pile up what each failed try had loaded
            except Exception:  # start-up's barrier must still be reached, or start() waits for ever
                log.exception("class %s: closing a worker that failed to load failed", self.klass.name)
        if ready is not None:
            ready.wait()
        elif worker.error is not None:
            log.error("class %s: the replacement worker failed to load: %s", self.klass.name, worker.error)
        else:
            log.info("class %s: a new worker serves", self.klass.name)
        if worker.error is None:
            worker.serve()
