"""A few schedules of tests/stress/chaos.py: signals at random moments and aimed into
warm-ups on the loop's thread, under load in every class. Each must end with exit 0, no
traceback, and every request answered exactly once. The seed is drawn and printed
(EDGED_CHAOS_SEED replays one); `python tests/stress/chaos.py --schedules 40` is the
long run."""

from __future__ import annotations

import os
import random

from stress import chaos

SCHEDULES = 3


def test_signals_at_any_moment_end_cleanly_and_every_request_is_answered_once() -> None:
    first = int(os.environ.get("EDGED_CHAOS_SEED", random.randrange(1 << 30)))
    print(f"chaos seeds {first}..{first + SCHEDULES - 1} (EDGED_CHAOS_SEED={first} replays them)")
    for seed in range(first, first + SCHEDULES):
        outcome = chaos.run(chaos.Schedule.drawn(seed))
        assert outcome.ok, f"{outcome.schedule}:\n" + "\n".join(outcome.problems)
