"""bench/ingest.py drives the real dispatcher and lanes in its own process, so a change
to their construction breaks it where no other test looks (it did: Dispatcher.serve
took the memory plan, and the bench failed at start). A short run of it, here."""

from __future__ import annotations

from support import run_bench


def test_the_ingest_bench_runs_and_reports_each_step() -> None:
    done = run_bench("ingest.py", "--messages", "200", timeout_s=120)
    for line in ("admitted and queued", "shed: queue full", "shed: deadline", "step: the lane's offer (a shed)"):
        assert line in done.stdout, done.stdout
