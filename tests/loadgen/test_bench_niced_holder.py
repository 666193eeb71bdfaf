"""bench/niced_holder.py reports, for a holder at nice 10 and at nice 0, how late the
sleeper beside it woke: a short run."""

from __future__ import annotations

import re

from support import run_bench

LINE = re.compile(r"round 1, holder at nice +(\d+): the sleeper late p50 [\d.]+, .* (\d+) of (\d+) wake-ups past 5 ms")


def test_the_niced_holder_bench_reports_both_niceness_levels() -> None:
    done = run_bench("niced_holder.py", "--rounds", "1", "--seconds", "0.3", timeout_s=60)
    found = [LINE.fullmatch(line) for line in done.stdout.splitlines()]
    assert [int(match[1]) for match in found if match] == [10, 0], done.stdout
    assert all(int(match[3]) > 50 for match in found if match), done.stdout  # about 300 wake-ups of 1 ms each
