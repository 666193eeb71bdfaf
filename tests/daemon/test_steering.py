"""The steering thread sleeps until its next timer: an idle daemon wakes it a few times a
second (the loops' fence, a call that may be stuck, the sweep), not on a fixed tick; and
the watchdog's next look is when the oldest open call would pass its limit."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from edged.serve.lanes.watchdog import OpenCalls

IDLE_S = 3.0
# A fixed 50 ms tick woke it 24 times a second; sleeping to its timers, about 4 (one
# timer, and the three loops' answers to the fence it asks each second).
MOST_WAKES_PER_S = 10


def wakes(pid: int) -> int:
    """How often the main thread has gone to sleep (its voluntary context switches)."""
    status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("voluntary_ctxt_switches"))


def test_an_idle_daemon_wakes_its_steering_thread_a_few_times_a_second(own_daemon) -> None:
    running = own_daemon()
    time.sleep(1.0)  # past the first turns after opening
    before = wakes(running.pid)
    time.sleep(IDLE_S)
    rate = (wakes(running.pid) - before) / IDLE_S
    assert rate < MOST_WAKES_PER_S, f"the steering thread woke {rate:.1f} times a second at idle"
    assert running.stop() == 0


def test_the_watchdog_looks_next_when_the_oldest_open_call_passes_its_limit() -> None:
    calls = OpenCalls()
    assert calls.oldest_ns(123) == 123  # none open: a call that begins now is the soonest
    began = threading.Event()
    release = threading.Event()

    def call(started_ns: int) -> None:
        calls.begin([], started_ns)
        began.set()
        release.wait()
        calls.end()

    threads = []
    for started_ns in (50, 20):
        threads.append(threading.Thread(target=call, args=(started_ns,)))
        threads[-1].start()
        began.wait()
        began.clear()
    assert calls.oldest_ns(100) == 20
    calls.overdue(now_ns=100, limit_ns=60)  # the call begun at 20 is found overdue: looked at once
    assert calls.oldest_ns(100) == 50
    release.set()
    for thread in threads:
        thread.join()
    assert calls.oldest_ns(100) == 100


def test_a_thread_given_up_on_is_replaced_once_whatever_calls_it_makes_after() -> None:
    """An abandoned worker that returns and makes more calls (re-running a failed batch's
    jobs one by one, a pipeline's next step) is not found overdue, and replaced, again."""
    calls = OpenCalls()
    found = []

    def call_twice() -> None:
        calls.begin([], 0)
        found.append(calls.overdue(now_ns=100, limit_ns=10))
        calls.end()
        calls.begin([], 200)  # a later call of the thread given up on
        found.append(calls.overdue(now_ns=1_000, limit_ns=10))
        calls.end()

    thread = threading.Thread(target=call_twice)
    thread.start()
    thread.join()
    assert calls.abandoned(thread)
    assert [overdue.workers_lost for overdue in found] == [1, 0], found
