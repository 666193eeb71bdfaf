"""Counters and latency histograms per class, cheap enough for the hot path.

Histograms are log-linear (HDR style): 16 sub-buckets per power of two, so a
percentile is within about 6% of the true value, in a fixed few hundred ints,
whatever the traffic. No per-request list is ever kept.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

_SUB_BITS = 4
_SUB = 1 << _SUB_BITS
_BUCKETS = _SUB * 40  # covers every value below 2**40 us (12 days)
PERCENTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99, "p999": 0.999}


def _bucket(value: int) -> int:
    if value < 2 * _SUB:
        return max(value, 0)
    shift = value.bit_length() - _SUB_BITS - 1  # keeps the top 5 bits: 16 sub-buckets per power of two
    return min(_SUB * shift + (value >> shift), _BUCKETS - 1)


def _bucket_value(index: int) -> int:
    """The middle of a bucket's range, the estimate reported for values in it."""
    if index < 2 * _SUB:
        return index
    shift = index // _SUB - 1
    low = ((index % _SUB) + _SUB) << shift
    return low + (1 << shift) // 2


class Histogram:
    """Latencies in microseconds."""

    __slots__ = ("counts", "max", "total")

    def __init__(self) -> None:
        self.counts = [0] * _BUCKETS
        self.total = 0
        self.max = 0

    def record(self, value_us: int) -> None:
        self.counts[_bucket(value_us)] += 1
        self.total += 1
        if value_us > self.max:
            self.max = value_us

    def percentile(self, q: float) -> int:
        if not self.total:
            return 0
        rank = q * self.total
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return min(_bucket_value(index), self.max)
        return self.max

    def summary(self) -> dict[str, int]:
        figures = {name: self.percentile(q) for name, q in PERCENTILES.items()}
        figures.update(max=self.max, count=self.total)
        return figures


@dataclass
class ClassStats:
    """One class's figures. Arrival-side counters are written by the socket loop
    only; completion-side ones by the lane's workers, under `lock`."""

    received: int = 0
    admitted: int = 0
    shed_queue_full: int = 0
    shed_deadline: int = 0
    expired: int = 0
    completed: int = 0
    failed: int = 0
    backend_calls: int = 0
    backend_rows: int = 0  # rows handed to the backend: shed or expired work never adds here
    late_dropped: int = 0  # results of calls the watchdog had given up on, never sent
    queue_us: Histogram = field(default_factory=Histogram)
    compute_us: Histogram = field(default_factory=Histogram)
    total_us: Histogram = field(default_factory=Histogram)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record_done(self, ok: bool, queue_us: int, compute_us: int, total_us: int) -> None:
        with self.lock:
            if ok:
                self.completed += 1
            else:
                self.failed += 1
            self.queue_us.record(queue_us)
            self.compute_us.record(compute_us)
            self.total_us.record(total_us)

    def record_backend_call(self, rows: int) -> None:
        with self.lock:
            self.backend_calls += 1
            self.backend_rows += rows

    def record_expired(self, count: int = 1) -> None:
        with self.lock:
            self.expired += count

    def snapshot(self, queue_depth: int) -> dict[str, Any]:
        with self.lock:
            return {
                "received": self.received,
                "admitted": self.admitted,
                "shed": {"queue_full": self.shed_queue_full, "deadline": self.shed_deadline},
                "expired": self.expired,
                "completed": self.completed,
                "failed": self.failed,
                "backend_calls": self.backend_calls,
                "backend_rows": self.backend_rows,
                "late_dropped": self.late_dropped,
                "queue_depth": queue_depth,
                "latency_us": {
                    "queue": self.queue_us.summary(),
                    "compute": self.compute_us.summary(),
                    "total": self.total_us.summary(),
                },
            }
