"""The backend calls a lane is inside, so that one that never returns is found,
its requests answered, and its worker replaced.

A thread stuck inside a runtime cannot be stopped from Python. What can be done:
answer its requests (INTERNAL, once: `claim` makes sure the late reply, should the
call ever return, is dropped), stop counting on that worker, and start another.
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
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, _Call] = {}
        self.abandoned: set[int] = set()  # idents of worker threads given up on

    def begin(self, jobs: list[Job], now_ns: int) -> None:
        with self._lock:
            self._open[threading.get_ident()] = _Call(now_ns, jobs)

    def end(self) -> None:
        with self._lock:
            self._open.pop(threading.get_ident(), None)

    def claim(self, job: Job) -> bool:
        """True for exactly one caller per job: the one that may answer it."""
        with self._lock:
            if job.answered:
                return False
            job.answered = True
            return True

    def overdue(self, now_ns: int, limit_ns: int) -> list[Job]:
        """Claim the unanswered jobs of every call open longer than `limit_ns`, and
        abandon the threads inside those calls."""
        stuck: list[Job] = []
        with self._lock:
            for ident, call in self._open.items():
                if ident in self.abandoned or now_ns - call.started_ns <= limit_ns:
                    continue
                self.abandoned.add(ident)
                for job in call.jobs:
                    if not job.answered:
                        job.answered = True
                        stuck.append(job)
        return stuck

    def current_abandoned(self) -> bool:
        return threading.get_ident() in self.abandoned
