"""bench/hot_path.py times the serving path's steps and decisions by their names: one renamed
or taken off the path would leave its row at zero, where no other test looks. A short run."""

from __future__ import annotations

import json
from pathlib import Path

from support import run_bench


def test_the_hot_path_bench_times_every_step_of_a_light_request(tmp_path: Path) -> None:
    figures = tmp_path / "hot.json"
    # 600 requests: the process CPU figures are read in the kernel's 10 ms ticks; a short run can read 0.
    run_bench("hot_path.py", "--requests", "600", "--json", str(figures))
    result = json.loads(figures.read_text())
    for label, step in result["steps"].items():
        assert step["calls_per_request"] >= 1, (label, step)
        assert step["cpu_us"] > 0, (label, step)
    for label, decision in result["decisions"].items():
        assert decision["calls_per_request"] >= 1, (label, decision)
    assert result["naive"]["process_cpu_us"] > 0
    assert all(cpu_us > 0 for cpu_us in result["naive"]["steps_cpu_us"].values()), result["naive"]
