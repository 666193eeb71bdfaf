"""The watchdog over a lane's backend calls: it finds a call that never returns, so
that its requests are answered and its worker replaced.

A thread stuck inside a runtime cannot be stopped from Python. What can be done:
answer its requests (INTERNAL, through edged.serve.answers, which drops the late
result should the call ever return), stop counting on that worker, and start another.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from edged.serve.batching import Job


@dataclass(slots=True)
class _Call:
    started_ns: int
    jobs: list[Job]


class OpenCalls:
    """The backend calls a lane's workers are inside, and the workers given up on.

    Writers, under `_lock`: each worker opens and closes its own call (`begin`,
    `end`); the watchdog (`overdue`, from the socket loop's tick or the shutdown)
    abandons the threads of calls open too long.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, _Call] = {}
        self._abandoned: set[int] = set()  # idents of worker threads given up on

    def begin(self, jobs: list[Job], now_ns: int) -> None:
        with self._lock:
            self._open[threading.get_ident()] = _Call(now_ns, jobs)

    def end(self) -> None:
        with self._lock:
            self._open.pop(threading.get_ident(), None)

    def overdue(self, now_ns: int, limit_ns: int) -> list[Job]:
        """The jobs of every call open longer than `limit_ns`; the threads inside those
        calls are abandoned. Some of the jobs may have been answered already."""
        jobs: list[Job] = []
        with self._lock:
            for ident, call in self._open.items():
                if ident in self._abandoned or now_ns - call.started_ns <= limit_ns:
                    continue
                self._abandoned.add(ident)
                jobs.extend(call.jobs)
        return jobs

    def done_ns(self, now_ns: int) -> int:
        """How much of the work charged for the calls in flight is already done, by
        their elapsed time (each at most its charge): admission counts only the rest
        as ahead (socket loop, on each arrival)."""
        if not self._open:
            return 0
        # A snapshot without the lock: a call that begins or ends meanwhile is off by one call.
        calls = list(self._open.values())
        return sum(min(now_ns - call.started_ns, sum(job.cost_ns for job in call.jobs)) for call in calls)

    def abandoned(self, thread: threading.Thread) -> bool:
        """Whether the watchdog gave up on `thread`: a worker asks before each job."""
        # A set lookup without the lock: a stale answer only delays the worker by one job.
        return thread.ident in self._abandoned
