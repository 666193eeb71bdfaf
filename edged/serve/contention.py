"""What the box's other processes take of its cores, so a lane's pace restarts after an idle
spell (Backlog.starting_pace) at the share of a core the fair scheduler gives its workers beside
what the others used in the last second, not a whole core: beside busy cores a worker at
nice 0 gets about half, one at nice 10 a tenth, and a burst admitted as if it had a core
expired in the queue.

Sampled by the steering thread (its one writer, every second); read by the loops.
"""

from __future__ import annotations

import os
import threading
import time
from typing import NamedTuple

# The fair scheduler's weight of a nice-0 thread; each nice level divides it by 1.25
# (the kernel's sched_prio_to_weight table, within 1%).
NICE_0_WEIGHT = 1024.0
NICE_STEP = 1.25
# The shortest span a sample covers: /proc/stat counts in ticks of 10 ms.
MIN_SAMPLE_S = 0.5


class Contention:
    """The share of the box's cores its other processes used over the last sample."""

    def __init__(self) -> None:
        self.others = 0.0  # 0: they used none of any core; 1: all of every core
        self._last = _reading()
        self._owner = threading.get_ident()  # the steering thread: the one that made it

    def sample(self) -> None:
        """Measure since the last sample: the steering thread's, about every second (another raises)."""
        if threading.get_ident() != self._owner:
            raise RuntimeError(
                f"the box's load is sampled by the steering thread only, not {threading.current_thread().name!r}"
            )
        now, last = _reading(), self._last
        if now is not None and last is not None:
            wall_s = now.at_s - last.at_s
            if wall_s < MIN_SAMPLE_S:
                return  # too short for the kernel's 10 ms ticks: measured at a later call
            others_s = (now.busy_s - last.busy_s) - (now.own_s - last.own_s)
            self.others = min(max(others_s / (wall_s * now.cores), 0.0), 1.0)
        self._last = now

    def share(self, nice: int) -> float:
        """The share of a core a thread at `nice` gets when it wants one: all of it where
        nothing else runs, its weight's part of a core where another process keeps it busy."""
        weight = NICE_0_WEIGHT / NICE_STEP**nice
        return (1.0 - self.others) + self.others * weight / (weight + NICE_0_WEIGHT)


class Reading(NamedTuple):
    """The cores this process may run on (only those: a daemon may be pinned to some of a
    larger box), how long they have been busy, and how much of it was this process."""

    at_s: float
    busy_s: float
    own_s: float
    cores: int


def _reading() -> Reading | None:
    mine = {f"cpu{core}" for core in os.sched_getaffinity(0)}
    busy = 0
    try:
        with open("/proc/stat") as stat:
            for line in stat:
                name, *fields = line.split()
                if name in mine:
                    # user nice system idle iowait irq softirq steal [guest guest_nice]: guest is in user already.
                    ticks = [int(field) for field in fields[:8]]
                    busy += sum(ticks) - ticks[3] - ticks[4]
    except (OSError, ValueError):
        return None  # not Linux, or no /proc: the guess stays each worker's whole core
    return Reading(time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), time.process_time(), len(mine))
