"""This machine's own figures, measured once per process, for the settings derived
from them (edged.config.classes): a figure tuned on one CPU is wrong on the next."""

from __future__ import annotations

import functools
import queue
import threading
import time

HANDOFF_WARMUP = 20
HANDOFF_SAMPLES = 100
# Between samples: long enough for the echoing thread to fall asleep in its wait, so
# that each sample pays the wake-up a lane's idle worker pays.
HANDOFF_NAP_S = 0.0002


@functools.cache
def handoff_us() -> float:
    """The fastest round trip, in us, of a value handed to a sleeping thread and handed
    back: what giving a job to a lane's idle worker and taking its answer back costs
    on this machine before any work is done. Measured once per process (about 40 ms).

    The fastest, not the median: on a 2-core VM the median of one start-up ranged from
    13 to 97 us (a core waking from idle, another process's turn), the fastest of 100
    from 11 to 15. A figure of the machine, not of the moment it was taken."""
    there: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    back: queue.SimpleQueue[int] = queue.SimpleQueue()

    def echo() -> None:
        while (value := there.get()) is not None:
            back.put(value)

    thread = threading.Thread(target=echo, name="handoff-probe", daemon=True)
    thread.start()
    samples = []
    try:
        for i in range(HANDOFF_WARMUP + HANDOFF_SAMPLES):
            time.sleep(HANDOFF_NAP_S)
            start_ns = time.perf_counter_ns()
            there.put(i)
            back.get()
            samples.append(time.perf_counter_ns() - start_ns)
    finally:
        there.put(None)
        thread.join()
    return min(samples[HANDOFF_WARMUP:]) / 1000
