"""The watchdog over a lane's backend calls. Python cannot stop a thread stuck inside a runtime,
so an overdue call's requests are answered INTERNAL (Answers drops a result that comes later)
and its worker is given up and replaced.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from edged.serve.lanes.batching import Job


@dataclass(slots=True)
class _Call:
    thread: threading.Thread
    started_ns: int
    jobs: list[Job]
    charge_ns: int  # its jobs' charged work, summed once: admission reads it on every arrival
    overdue: bool = False  # found overdue: its jobs were already handed over


@dataclass(frozen=True, slots=True)
class Overdue:
    """The jobs of calls open too long, what their threads held back from those calls' batches
    (for the queue again), and how many worker threads were given up on (each wants a replacement)."""

    jobs: list[Job]
    held: list[Any]
    retimings: list[int]  # the charges of calls with no job: re-timings, which answer nobody
    workers_lost: int


class OpenCalls:
    """The backend calls a lane is inside. Under `_lock`, each thread opens and closes its own
    call, and a job it holds outside the queue (left out of its batch, or waiting its turn); the
    watchdog (`overdue`, on the daemon's steering thread) marks calls overdue once, abandons their
    threads and takes what they hold, and a stop takes everything held. A loop's inline calls
    are not watched here (Lane._run_inline)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, _Call] = {}
        self._held: dict[int, Any] = {}  # a queue item each thread took but has not begun a call for
        # Worker threads given up on: the objects, not their idents, which a new thread may reuse.
        self._abandoned: set[threading.Thread] = set()
        self._closed = False  # a stop took what the threads hold: no call begins after it

    def begin(self, jobs: list[Job], now_ns: int, retiming_ns: int = 0) -> bool:
        """This thread enters a backend call for `jobs`, or, with none, a re-timing charged
        `retiming_ns`; False once a stop closed the calls: the call must not start."""
        me = threading.current_thread()
        charge_ns = sum(job.cost_ns for job in jobs) if jobs else retiming_ns
        with self._lock:
            if self._closed:
                return False
            # A thread given up on is replaced once: a later call of its own counts as found overdue already.
            self._open[threading.get_ident()] = _Call(me, now_ns, jobs, charge_ns, me in self._abandoned)
        return True

    def end(self) -> None:
        with self._lock:
            self._open.pop(threading.get_ident(), None)

    def hold(self, item: Any) -> None:
        """Keep what this thread took from the queue but has not begun a call for (left out of
        its batch, or waiting its turn): a thread stuck meanwhile would keep it from every worker,
        and from a stop."""
        with self._lock:
            self._held[threading.get_ident()] = item

    def take_held(self) -> Any:
        """What this thread holds, unless the watchdog or a stop took it; None if nothing."""
        with self._lock:
            return self._held.pop(threading.get_ident(), None)

    def close(self) -> list[Any]:
        """A stop: no call begins from now on, and everything every thread holds is taken from
        them, at one moment (what a worker takes afterwards reaches `begin`, and is refused)."""
        with self._lock:
            self._closed = True
            held, self._held = list(self._held.values()), {}
        return held

    def overdue(self, now_ns: int, limit_ns: int) -> Overdue:
        """The jobs of calls newly open past `limit_ns` (some may be answered already), and
        what their threads hold; abandons those threads, whose re-timings' charges pass to the caller."""
        jobs: list[Job] = []
        held: list[Any] = []
        retimings: list[int] = []
        lost = 0
        with self._lock:
            for ident, call in self._open.items():
                if call.overdue or now_ns - call.started_ns <= limit_ns:
                    continue
                call.overdue = True
                jobs.extend(call.jobs)
                if not call.jobs:
                    retimings.append(call.charge_ns)
                if ident in self._held:
                    held.append(self._held.pop(ident))
                self._abandoned.add(call.thread)
                lost += 1
        return Overdue(jobs, held, retimings, lost)

    def oldest_ns(self, now_ns: int) -> int:
        """When the oldest call not yet found overdue began; `now_ns` with none open."""
        with self._lock:
            return min((call.started_ns for call in self._open.values() if not call.overdue), default=now_ns)

    def progress(self, now_ns: int, rate: float) -> tuple[int, int]:
        """(done, charged) ns of the calls in flight, for admission on the lane's loop. A call's
        done part is its time so far at `rate`, priced work per ns (its worker's share of the
        lane's pace), capped at its charge: on a busy box a 3.5 ms call took 35 ms."""
        if not self._open:
            return 0, 0
        # A snapshot without the lock: a call that begins or ends meanwhile is off by one call.
        done_ns = charged_ns = 0
        for call in list(self._open.values()):
            if call.overdue:  # its charge left the backlog when the watchdog took it over
                continue
            done_ns += min(int((now_ns - call.started_ns) * rate), call.charge_ns)
            charged_ns += call.charge_ns
        return done_ns, charged_ns

    def abandoned(self, thread: threading.Thread) -> bool:
        """Asked by a worker before each job."""
        # A set lookup without the lock: a stale answer only delays the worker by one job.
        return thread in self._abandoned
