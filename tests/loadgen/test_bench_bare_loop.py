"""bench/bare_loop.py runs edged as shipped, edged with its serving decisions taken out,
the naive server waiting in a receive and waiting in zmq_poll, and a baseline checkout's
daemon, and reports each one's figures: a short run (this checkout stands in for the
baseline). A bare daemon whose handler failed would answer fast and wrong; the script
refuses replies that are not OK."""

from __future__ import annotations

import json
from pathlib import Path

from support import REPO_ROOT, run_bench


def test_the_bare_loop_bench_measures_every_server(tmp_path: Path) -> None:
    figures = tmp_path / "bare.json"
    args = ["--rounds", "2", "--requests", "100", "--baseline", str(REPO_ROOT), "--json", str(figures)]
    run_bench("bare_loop.py", *args)
    result = json.loads(figures.read_text())
    assert set(result["summary"]) == {"edged", "edged, bare", "naive", "naive, polled", "edged, before"}
    for side, runs in result["runs"].items():
        assert len(runs) == 2, side
        for run in runs:
            assert run["p50_us"] > 0 and run["p99_us"] >= run["p50_us"] and run["thread_cpu_us"] > 0, (side, run)
    assert result["summary"]["naive"]["p50_us"]["to_naive"] == 1.0
