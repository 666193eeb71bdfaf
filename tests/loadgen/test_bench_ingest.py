"""bench/ingest.py drives the real dispatcher and lanes in its own process, so a change
to their construction breaks it where no other test looks (it did: Dispatcher.serve
took the memory plan, and the bench failed at start). A short run of it, here."""

from __future__ import annotations

import subprocess
import sys

from support import REPO_ROOT


def test_the_ingest_bench_runs_and_reports_each_step() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "ingest.py"), "--messages", "200"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for line in ("admitted and queued", "shed: queue full", "shed: deadline", "step: the lane's offer (a shed)"):
        assert line in done.stdout, done.stdout
