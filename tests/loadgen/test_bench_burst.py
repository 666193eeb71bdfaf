"""bench/burst.py gives a small burst to the floor and to edged, and sets the whole burst
beside the floor's time plus the admitted requests' own compute: the bulk lane's calls
and rows from `stats`, priced by cnn-heavy timed in the bench's own process. With
--realtime-apart, realtime's peers are answered by a floor of their own beside edged's burst;
with --class-socket, edged takes the burst on bulk's own socket."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_bench

pytestmark = pytest.mark.slow


def test_the_burst_bench_prices_the_admitted_requests_compute(tmp_path: Path) -> None:
    figures = tmp_path / "burst.json"
    args = ["--runs", "1", "--peers", "20", "--per-peer", "5", "--realtime-s", "2", "--realtime-apart"]
    args += ["--class-socket", "--json", str(figures)]
    done = run_bench("burst.py", *args)
    result = json.loads(figures.read_text())
    own = result["own_compute"]
    # cnn-heavy takes milliseconds a row on any CPU, and a row more costs something.
    assert 1e-4 < own["first_row_s"] < 1.0 and 0 < own["extra_row_s"] < own["first_row_s"] * 2
    (run,) = result["runs"]
    edged = run["this checkout"]
    burst, calls = edged["burst"], edged["bulk_calls"]
    assert burst["lost"] == 0 and burst["duplicated"] == 0
    assert burst["endpoint"].endswith("-bulk.sock"), burst["endpoint"]  # --class-socket: bulk's own
    # 100 requests of one row with a 3 s deadline: the daemon ran every one it admitted,
    # each row in exactly one call, and the lane's counts say so.
    admitted = burst["admitted"]
    assert admitted > 0 and calls["rows"] == admitted and 1 <= calls["calls"] <= admitted
    assert "against the floor's time plus the admitted requests' own compute" in done.stdout
    # Realtime sent apart, to a floor of its own: every request answered there, none by the daemon.
    apart = run["realtime apart"]
    assert apart["burst"]["lost"] == 0 and apart["realtime"]["sent"] > 0
    assert apart["realtime"]["statuses"] == {"OK": apart["realtime"]["sent"]}, apart["realtime"]
    assert apart["realtime"]["daemon_total_ms"] == {}, "a floor's replies carry no timing_us"
    assert "sent to a floor server of their own" in done.stdout
