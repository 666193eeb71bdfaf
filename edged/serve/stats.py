"""Counters and latency histograms (edged.metrics.histogram) per class, cheap enough for the hot path."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from edged.metrics.histogram import Histogram


@dataclass
class ClassStats:
    """One class's figures. Arrivals (received, admitted, shed, inline) are written by the
    class's loop alone. Outcomes (answers, backend calls, expiries, late results) come from
    whichever thread answers a job, so they are counted under `_lock`, and `snapshot` reads
    under it: a reader on any thread gets one whole moment.
    """

    received: int = 0
    admitted: int = 0
    shed_queue_full: int = 0
    shed_deadline: int = 0
    shed_bytes: int = 0  # over limits.max_pending_bytes(_per_peer) (edged.serve.pending)
    expired: int = 0
    completed: int = 0
    late_completed: int = 0  # of those, answered OK after their deadline (admission misjudged their cost)
    failed: int = 0
    backend_calls: int = 0
    backend_rows: int = 0  # rows handed to the backend: shed or expired work never adds here
    late_dropped: int = 0  # results of calls the watchdog had given up on, never sent
    inline: int = 0  # requests run on the class's loop itself (edged.serve.lanes.lane)
    queue_us: Histogram = field(default_factory=Histogram)
    compute_us: Histogram = field(default_factory=Histogram)
    total_us: Histogram = field(default_factory=Histogram)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count_shed(self, reason: str) -> None:
        """A request shed on arrival, for a Shed's `reason` (the loop's own count)."""
        if reason == "queue_full":
            self.shed_queue_full += 1
        elif reason == "deadline":
            self.shed_deadline += 1
        else:
            self.shed_bytes += 1

    def done(self, ok: bool, queue_us: int, compute_us: int, total_us: int, late: bool = False) -> None:
        """A request answered after admission, OK or failed, with its times; `late`: past its deadline."""
        with self._lock:
            if ok:
                self.completed += 1
                self.late_completed += late
            else:
                self.failed += 1
            self.queue_us.record(queue_us)
            self.compute_us.record(compute_us)
            self.total_us.record(total_us)

    def call(self, rows: int) -> None:
        """A backend call of `rows` rows, about to start."""
        with self._lock:
            self.backend_calls += 1
            self.backend_rows += rows

    def expiry(self) -> None:
        """A request whose deadline passed while it was queued."""
        with self._lock:
            self.expired += 1

    def late_result(self) -> None:
        """A result the watchdog had already answered for, dropped."""
        with self._lock:
            self.late_dropped += 1

    def snapshot(self, queue_depth: int) -> dict[str, Any]:
        """The figures as the stats op shows them."""
        with self._lock:
            return {
                "received": self.received,
                "admitted": self.admitted,
                "shed": {"queue_full": self.shed_queue_full, "deadline": self.shed_deadline, "bytes": self.shed_bytes},
                "expired": self.expired,
                "completed": self.completed,
                "late_completed": self.late_completed,
                "failed": self.failed,
                "backend_calls": self.backend_calls,
                "backend_rows": self.backend_rows,
                "late_dropped": self.late_dropped,
                "inline": self.inline,
                "queue_depth": queue_depth,
                "latency_us": {
                    "queue": self.queue_us.summary(),
                    "compute": self.compute_us.summary(),
                    "total": self.total_us.summary(),
                },
            }
