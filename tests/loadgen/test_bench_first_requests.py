"""bench/first_requests.py starts a daemon, calls it from before it listens until it has
answered OK enough times, and reports the first OK's round trip apart from the rest: a
short run (this checkout stands in for the baseline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import REPO_ROOT, run_bench

pytestmark = pytest.mark.slow


def test_the_first_requests_bench_times_the_first_ok_apart(tmp_path: Path) -> None:
    figures = tmp_path / "first.json"
    run_bench(
        "first_requests.py", "--rounds", "1", "--answers", "20", "--baseline", str(REPO_ROOT), "--json", str(figures)
    )
    result = json.loads(figures.read_text())
    assert set(result["rounds"]) == {"edged", "edged, before"}
    for side, rounds in result["rounds"].items():
        (figures_of_round,) = rounds
        statuses = figures_of_round["statuses"]
        # Called from before it listened: refused while it started, then 20 OK.
        assert set(statuses) <= {"OK", "UNAVAILABLE"} and statuses["OK"] == 20, (side, statuses)
        after = figures_of_round["after_ms"]
        assert figures_of_round["first_ok_ms"] > 0 and 0 < after["p50"] <= after["p99"] <= after["max"], side
        assert figures_of_round["first_ok_s"] > 0, side
