"""The latency histogram keeps what the stats op and Prometheus report within its stated
error: each percentile within about 3% of the exact one, small values and the maximum exact."""

from __future__ import annotations

import numpy as np
import pytest

from edged.metrics.histogram import PERCENTILES, Histogram

# Its docstring's bound: 16 sub-buckets per power of two, each reported at its middle, so off by at
# most half a bucket, 1/32 of the bucket's lower edge.
RELATIVE_ERROR = 1 / 32


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_percentile_is_within_its_stated_error_of_the_exact_one(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # Latencies as a daemon sees them: mostly a few hundred us, a long tail into seconds.
    values = np.concatenate([rng.lognormal(5.5, 0.4, 20_000), rng.lognormal(9.0, 1.5, 200)]).astype(np.int64)
    histogram = Histogram()
    for value in values.tolist():
        histogram.record(value)
    summary = histogram.summary()
    assert summary["count"] == len(values) and summary["max"] == values.max()
    assert [summary[name] for name in PERCENTILES] == [histogram.percentile(q) for q in PERCENTILES.values()]
    for q in [*np.linspace(0.01, 0.99, 99), 0.995, 0.999]:
        exact = float(np.percentile(values, q * 100, method="inverted_cdf"))
        assert abs(histogram.percentile(q) - exact) <= RELATIVE_ERROR * exact, (q, histogram.percentile(q), exact)


def test_values_below_32_us_are_kept_exactly_and_an_empty_histogram_reports_zeros() -> None:
    assert Histogram().summary() == {name: 0 for name in PERCENTILES} | {"max": 0, "count": 0}
    histogram = Histogram()
    for value in range(32):
        histogram.record(value)
    assert [histogram.percentile((value + 1) / 32) for value in range(32)] == list(range(32))
