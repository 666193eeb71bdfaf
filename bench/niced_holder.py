"""A niced thread that holds the interpreter lock now and then, on a busy box: how late a
nice-0 thread's wake-ups come beside it, with that thread at nice 10 and at nice 0.

    python bench/niced_holder.py [--rounds 3] [--seconds 5]

The holder stands in for a lane's worker: hashing 8 MiB, which releases the lock (as
ONNX Runtime's run does), then about 100 us of Python that holds it (as a worker's
batching and answers do). The sleeper stands in for a loop: it sleeps 1 ms, again and
again, and counts how late it runs again. A busy loop on each core, at nice 0
(edged.loadgen.launch.busy_loops), keeps the box busy throughout. Where the kernel sets the holder aside while it holds
the lock, the sleeper waits for it to be given a core again: at nice 10, beside busy
cores, that can take tens of milliseconds.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import threading
import time

from edged.daemon.daemon import GIL_SWITCH_INTERVAL_S
from edged.loadgen.launch import busy_loops

SLEEP_S = 0.001
LATE_MS = 5.0  # a wake-up this late is counted apart


def one_round(holder_nice: int, seconds: float) -> dict[str, float]:
    """The sleeper's lateness, in ms, beside a holder at `holder_nice`."""
    stop = threading.Event()
    block = os.urandom(1 << 20)
    late: list[float] = []

    def holder() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), holder_nice)
        while not stop.is_set():
            for _ in range(8):
                hashlib.sha256(block).digest()
            total = 0
            for i in range(3000):
                total += i

    def sleeper() -> None:
        while not stop.is_set():
            due = time.perf_counter() + SLEEP_S
            time.sleep(SLEEP_S)
            late.append((time.perf_counter() - due) * 1000)

    threads = [threading.Thread(target=holder), threading.Thread(target=sleeper)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    late.sort()
    return {
        "p50": statistics.median(late),
        "p99": late[int(len(late) * 0.99)],
        "p99.9": late[int(len(late) * 0.999)],
        "max": late[-1],
        "past_5ms": sum(value > LATE_MS for value in late),
        "wake_ups": len(late),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per holder niceness, per round")
    args = parser.parse_args()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)  # the daemon's own
    with busy_loops():
        for round_number in range(1, args.rounds + 1):
            for nice in (10, 0):
                late = one_round(nice, args.seconds)
                print(
                    f"round {round_number}, holder at nice {nice:2d}: the sleeper late p50 {late['p50']:.2f}, "
                    f"p99 {late['p99']:.2f}, p99.9 {late['p99.9']:.2f}, max {late['max']:.2f} ms; "
                    f"{late['past_5ms']} of {late['wake_ups']} wake-ups past {LATE_MS:.0f} ms",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
