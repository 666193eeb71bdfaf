"""Whether a loop polls for a while after its turn rather than sleep in its poll.

A request that finds its loop asleep pays the wake-up: the core back from the hypervisor's
idle, and caches that hold someone else's data (docs/benchmarks.md, "The spin"). A loop
measures, as it serves, the gap from the end of each turn to the next request on its
sockets. Where requests come back that fast (a client waiting on each answer), it polls
for up to twice that gap first; at low rates and at idle it never does. And it polls only
while nothing else in the daemon has work (Serving.quiet): a spin beside a computing
worker takes the interpreter lock from it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import zmq

# A gap counts at most this many times server.spin_max_us: a client that pauses now and then (an
# idle second) leaves the spin armed, or disarms it for a few requests, not for a hundred.
GAP_COUNTED = 4
# The newest gap's weight in the average: a client that slows down disarms it within a few requests.
GAP_WEIGHT = 0.125


class Spin:
    """One loop's spin: written by that loop alone (`arrived`, `served`, `poll`); the stats op reads it."""

    __slots__ = ("gap_ns", "last_ns", "most_ns", "spins")

    def __init__(self, most_ns: int) -> None:
        self.most_ns = most_ns  # server.spin_max_us; 0: never
        self.gap_ns = float(GAP_COUNTED * most_ns)  # the average gap; disarmed until requests come close
        self.last_ns = 0  # when the loop last served requests: as they came, then as their turn ended
        self.spins = 0  # turns after which the loop polled rather than slept

    def arrived(self, gap_ns: int, now_ns: int) -> None:
        """A request came `gap_ns` after the loop's last turn ended."""
        self.gap_ns += (min(gap_ns, GAP_COUNTED * self.most_ns) - self.gap_ns) * GAP_WEIGHT
        self.last_ns = now_ns

    def served(self, now_ns: int) -> None:
        """The turn that read requests ended: counted from here, so that a loop whose inline
        call outlasts GAP_COUNTED spins' length still spins after it."""
        self.last_ns = now_ns

    def length_ns(self, now_ns: int) -> int:
        """How long the loop polls before it sleeps, now: twice the average gap, at most
        server.spin_max_us; 0 where the average gap is longer than that, or where no turn read
        a request for as long as a gap counts (an idle loop woken by the daemon's own fences)."""
        if self.gap_ns > self.most_ns or now_ns - self.last_ns > GAP_COUNTED * self.most_ns:
            return 0
        return int(min(2 * self.gap_ns, self.most_ns))

    def poll(self, poller: zmq.Poller, until_ns: int, quiet: Callable[[], bool]) -> list[tuple[Any, int]]:
        """Poll without sleeping until something is ready, `until_ns` passes or `quiet` says no
        more; what is ready (empty: nothing came)."""
        self.spins += 1
        while not (ready := poller.poll(0)):
            # A thread woken on this core (ZeroMQ's I/O thread, bringing the next request) runs now.
            os.sched_yield()
            if time.monotonic_ns() >= until_ns or not quiet():
                break
        return ready
