"""bench/hot_path.py times the serving path's steps by their names: a step renamed or
taken off the path would leave its row at zero, where no other test looks. A short run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import REPO_ROOT


def test_the_hot_path_bench_times_every_step_of_a_light_request(tmp_path: Path) -> None:
    figures = tmp_path / "hot.json"
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "hot_path.py"), "--requests", "200", "--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(figures.read_text())
    for label, step in result["steps"].items():
        assert step["calls_per_request"] >= 1, (label, step)
        assert step["cpu_us"] > 0, (label, step)
    assert result["naive"]["process_cpu_us"] > 0
    assert all(cpu_us > 0 for cpu_us in result["naive"]["steps_cpu_us"].values()), result["naive"]
