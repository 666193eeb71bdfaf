"""Every admitted job answered, and counted, exactly once: by whoever ran it (a worker or the
class's loop), the lane's watchdog or shutdown, whichever claims it first. The claimant also
settles the job's class figures and backlog. Nothing else marks a job answered. Replies go to
the loop that owns the request's socket (edged.serve.transport.reply), which sends them.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from edged.serve.admission import Backlog
from edged.serve.lanes.batching import Job
from edged.serve.pending import PendingBytes
from edged.serve.stats import ClassStats
from edged.serve.transport import reply
from edged.wire import fast
from edged.wire.codec import Buffer, Status, encode_reply


def timing_us(queue_us: int, compute_us: int, total_us: int) -> dict[str, int]:
    """A reply's `timing_us` (docs/protocol.md): waiting, the backend call, and receipt to result."""
    return {"queue": queue_us, "compute": compute_us, "total": total_us}


class Answers:
    """One lane's answering: the one writer of `Job.answered`, under `_lock`."""

    def __init__(self, stats: ClassStats, backlog: Backlog, pending: PendingBytes) -> None:
        self.stats = stats
        self._backlog = backlog
        self._pending = pending
        self._lock = threading.Lock()

    def _claim(self, job: Job) -> bool:
        """True for exactly one caller per job: the one that may answer it."""
        with self._lock:
            if job.answered:
                return False
            job.answered = True
        self._pending.give_back(job.peer, job.nbytes)
        return True

    def result(
        self,
        job: Job,
        taken_ns: int,
        compute_ns: int,
        *,
        outputs: dict[str, np.ndarray] | None = None,
        error: str | None = None,
    ) -> None:
        """A job that ran: OK with its outputs, or INTERNAL with `error`."""
        if not self._claim(job):
            self.stats.late_result()  # the watchdog answered it while the call hung
            return
        done_ns = time.monotonic_ns()
        queue_us, compute_us = (taken_ns - job.received_ns) // 1000, compute_ns // 1000
        total_us = (done_ns - job.received_ns) // 1000
        try:
            frames, ok = _reply_frames(job, queue_us, compute_us, total_us, outputs, error)
        except Exception as exc:  # claimed: it must be answered here, whatever the runner returned
            error = f"the daemon failed on this request: {exc}"
            timing = timing_us(queue_us, compute_us, total_us)
            frames, ok = encode_reply(job.request_id, Status.INTERNAL, error=error, timing_us=timing), False
        self.stats.done(ok, queue_us, compute_us, total_us, late=done_ns > job.deadline_ns)
        self._backlog.finish(job.cost_ns)
        reply(job.route, frames)

    def expired(
        self,
        job: Job,
        message: str = "its deadline passed while it was queued; it was not run",
        ran: tuple[int, int] | None = None,
    ) -> None:
        """DEADLINE_EXCEEDED for a job whose deadline passed (or, a pipeline's, would pass) before it
        ran. `ran`: a pipeline's (taken, compute) ns when steps ran first, timed as compute."""
        if self._claim(job):
            self.stats.expiry()
            self._send_unrun(job, Status.DEADLINE_EXCEEDED, message, ran)

    def done_unanswered(self, cost_ns: int) -> None:
        """Work that answers nobody (a re-timing) is done: off the backlog."""
        self._backlog.finish(cost_ns)

    def unrun(self, job: Job, status: Status, message: str) -> bool:
        """A job that was not run (expired, or refused at shutdown); False if already answered."""
        if not self._claim(job):
            return False
        self._send_unrun(job, status, message)
        return True

    def failures(self, jobs: list[Job], now_ns: int, message: str) -> int:
        """INTERNAL for the jobs, not yet answered, of a call that never returned; how many."""
        count = 0
        for job in jobs:
            if self._claim(job):
                self.stats.done(False, 0, 0, (now_ns - job.received_ns) // 1000)
                self._send_unrun(job, Status.INTERNAL, message)
                count += 1
        return count

    def _send_unrun(self, job: Job, status: Status, message: str, ran: tuple[int, int] | None = None) -> None:
        waited_us = (time.monotonic_ns() - job.received_ns) // 1000
        if ran is None:
            timing = timing_us(waited_us, 0, waited_us)
        else:
            taken_ns, compute_ns = ran
            timing = timing_us((taken_ns - job.received_ns) // 1000, compute_ns // 1000, waited_us)
        # A pipeline's steps that ran (`ran`) did some of its work; the rest did none.
        self._backlog.finish(job.cost_ns, ran=ran is not None)
        reply(job.route, encode_reply(job.request_id, status, error=message, timing_us=timing))


def _reply_frames(
    job: Job, queue_us: int, compute_us: int, total_us: int, outputs: dict[str, np.ndarray] | None, error: str | None
) -> tuple[list[Buffer], bool]:
    """A ran job's reply and whether it is OK: the fast encoder for plain outputs, else the checked
    one (which refuses what the wire cannot carry) and shared-memory writes."""
    if error is None and outputs is not None and not job.into:
        frames = fast.encode_ok(job.request_id, queue_us, compute_us, total_us, outputs)
        if frames is not None:
            return frames, True
    timing = timing_us(queue_us, compute_us, total_us)
    if error is None:
        try:
            for name, slot in job.into.items():  # every slot checked before any byte is written
                slot.check(name, outputs[name].nbytes if outputs else 0)
            written = {name: slot.write(name, outputs[name]) for name, slot in job.into.items()} if outputs else {}
        except ValueError as exc:  # the client's slot is too small for what the model produced
            return encode_reply(job.request_id, Status.INVALID_ARGUMENT, error=str(exc), timing_us=timing), False
        try:
            return encode_reply(job.request_id, Status.OK, outputs=outputs, written=written, timing_us=timing), True
        except ValueError as exc:  # an output the wire cannot carry, such as float64
            error = f"the model's output cannot be sent: {exc}"
    return encode_reply(job.request_id, Status.INTERNAL, error=error, timing_us=timing), False
