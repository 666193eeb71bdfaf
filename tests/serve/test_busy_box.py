"""A box whose every core another process keeps busy: the lanes' pace after an idle
spell (`stats`' pace.after_idle, where admission starts a burst from) follows the
box's other load, and comes back once it ends."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from support import RunningDaemon

from edged.client import Client

pytestmark = pytest.mark.slow

SAMPLED_S = 3.0  # the steering thread samples the box's load every second, over at least half of one


def after_idle(daemon: RunningDaemon) -> dict[str, float]:
    with Client(daemon.ipc) as client:
        return {name: c["pace"]["after_idle"] for name, c in client.stats()["classes"].items()}


def test_the_pace_a_lane_starts_from_follows_the_other_processes_load(
    own_daemon: Callable[..., RunningDaemon],
) -> None:
    daemon = own_daemon()
    time.sleep(SAMPLED_S)
    quiet = after_idle(daemon)
    # One busy loop per core at the default niceness. Before this pace, a burst of
    # cnn-heavy with 300 ms to live was admitted at a whole core's pace, and 3-6 of the
    # 7-9 requests admitted expired in the queue (docs/benchmarks.md, "A busy box").
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(SAMPLED_S)
        busy = after_idle(daemon)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    time.sleep(SAMPLED_S)
    again = after_idle(daemon)
    # Bulk's workers run at nice 10: a tenth of a core beside a busy one; realtime's at 0, a half.
    assert quiet["bulk"] >= 0.7 and again["bulk"] >= 0.7, (quiet, busy, again)
    assert busy["bulk"] <= 0.3, (quiet, busy, again)
    assert 0.3 <= busy["realtime"] <= 0.75, (quiet, busy, again)
