"""Memory a burst leaves resident, given back off the serving threads. glibc's `malloc_trim`
returns it, but took 14 ms for 170 MiB, which a loop would wait for: so it runs on its own
thread (ctypes releases the GIL) once the RSS stops growing, at the daemon's priority (at
nice 19 it was preempted holding an arena's lock, and the loop waited behind it). Figures:
docs/benchmarks-history.md, "Bursts: what the burst leaves resident, given back"."""

from __future__ import annotations

import threading
import time

from edged.backends.host_memory import rss_bytes, trim

CHECK_EVERY_NS = 1_000_000_000
GROWTH = 1.25  # RSS past this multiple of its value after the last trim...
MIN_GROWTH_BYTES = 32 * 1024 * 1024  # ...and by at least this much, asks for a trim


class Trimmer:
    """`check` is the steering thread's (its housekeeping); the trimming thread alone writes `_after`."""

    def __init__(self) -> None:
        self._after = rss_bytes()  # the RSS after the last trim
        self._last = self._after  # the RSS at the last check
        self._next_check_ns = 0
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="trimmer", daemon=True)
        self._thread.start()

    @property
    def next_check_ns(self) -> int:
        return self._next_check_ns

    def check(self, now_ns: int) -> None:
        """At most once a second: wake the trimming thread if the RSS grew well past `_after` and stopped growing."""
        if now_ns < self._next_check_ns:
            return
        self._next_check_ns = now_ns + CHECK_EVERY_NS
        try:
            rss = rss_bytes()
        except OSError:  # out of descriptors a moment: a check missed, never the steering thread's end
            return
        last = self._last
        self._last = rss
        if last >= rss > self._after * GROWTH and rss - self._after > MIN_GROWTH_BYTES:
            self._wake.set()

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stop:
                return
            self._after = trim()
            time.sleep(CHECK_EVERY_NS / 1e9)  # at most one trim a second, even mid-burst
