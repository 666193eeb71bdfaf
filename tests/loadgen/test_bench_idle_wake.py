"""bench/idle_wake.py measures edged, edged on one core, the naive server and a baseline
checkout's daemon (this checkout stands in), with the box's cores idling and kept
awake, and keeps them awake only with busy loops that yield to every other thread
(SCHED_IDLE): a short run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from support import REPO_ROOT, run_bench

sys.path.insert(0, str(REPO_ROOT / "bench"))
from idle_wake import cores_awake


def test_the_idle_wake_bench_measures_every_server_both_ways(tmp_path: Path) -> None:
    figures = tmp_path / "idle.json"
    args = ["--rounds", "1", "--requests", "50", "--json", str(figures), "--baseline", str(REPO_ROOT)]
    run_bench("idle_wake.py", *args)
    ways = json.loads(figures.read_text())["ways"]
    servers, states = ("edged", "edged-one-core", "naive", "edged-before"), ("as the box is", "kept awake")
    assert set(ways) == {f"{server}, cores {state}" for server in servers for state in states}
    for way, figure in ways.items():
        assert figure["p50_us"] > 0, way
    assert ways["naive, cores kept awake"]["vs_naive"] == [1.0]


def test_the_cores_are_kept_awake_by_one_busy_loop_a_core_at_sched_idle() -> None:
    children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    before = set(children.read_text().split())  # the suite's own daemons, if any
    with cores_awake(True):
        spinners = [int(pid) for pid in set(children.read_text().split()) - before]
        assert len(spinners) == len(os.sched_getaffinity(0))
        assert all(os.sched_getscheduler(pid) == os.SCHED_IDLE for pid in spinners)
    assert set(children.read_text().split()) == before
    with cores_awake(False):
        assert set(children.read_text().split()) == before
