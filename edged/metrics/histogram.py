"""Latency histograms, log-linear (HDR style, 16 sub-buckets per power of two): a percentile
is within about 3%, in a fixed few hundred ints whatever the traffic; no per-request list is
kept. Written on the serving path (edged.serve.stats), read by the stats op and Prometheus."""

from __future__ import annotations

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
    """Latencies in microseconds; its writer holds a lock for it (edged.serve.stats.ClassStats)."""

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
