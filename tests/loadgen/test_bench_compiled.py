"""bench/compiled.py compiles part of the serving path with mypyc and runs it beside this
checkout and the naive server: a short run, one module compiled. A compiled daemon that
failed to start, or a copy that imported this checkout's Python instead, would fail here."""

from __future__ import annotations

import json
from pathlib import Path

from support import run_bench


def test_the_compiled_bench_builds_a_copy_and_measures_each_server(tmp_path: Path) -> None:
    figures = tmp_path / "compiled.json"
    # 1,000 requests: the CPU figure is read in the kernel's 10 ms ticks, and 100 of the naive
    # server's took under one tick on a fast box (read as 0 in one CI run).
    run_bench(
        "compiled.py", "--rounds", "1", "--requests", "1000", "--modules", "serve/admission.py", "--json", str(figures)
    )
    result = json.loads(figures.read_text())
    assert result["modules"] == ["serve/admission.py"]
    assert set(result["summary"]) == {"compiled", "python", "naive"}
    for server, runs in result["runs"].items():
        assert len(runs) == 1, server
        assert runs[0]["p50_us"] > 0 and runs[0]["p99_us"] >= runs[0]["p50_us"] and runs[0]["cpu_us"] > 0, server
    assert result["runs"]["compiled"][0]["compiled_loaded"] and not result["runs"]["python"][0]["compiled_loaded"]
    assert result["summary"]["naive"]["rounds_p50_vs_naive"]["median"] == 1.0
