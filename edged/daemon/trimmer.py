"""Memory a burst leaves resident, given back off the serving threads. glibc's `malloc_trim`
returns it, but took 14 ms for 170 MiB, which a loop would wait for: so it runs on its own
thread (ctypes releases the GIL) once the RSS stops growing, at the daemon's priority (at
nice 19 it was preempted holding an arena's lock, and the loop waited behind it). Figures:
docs/benchmarks-history.md, "Bursts: what the burst leaves resident, given back"."""

from __future__ import annotations

import threading
import time

from edged.backends.host_memory import rss_bytes, trim
from edged.threads import NamedThread

TRIM_EVERY_S = 1.0  # at most one trim a second, even mid-burst
GROWTH = 1.25  # RSS past this multiple of its value after the last trim...
MIN_GROWTH_BYTES = 32 * 1024 * 1024  # ...and by at least this much, asks for a trim


class Trimmer:
    """`check` is the steering thread's (its housekeeping, once a second); the trimming thread
    alone writes `_after`."""

    def __init__(self) -> None:
        self._after = rss_bytes()  # the RSS after the last trim
        self._last = self._after  # the RSS at the last check
        self._wake = threading.Event()
        self._stop = False
        self._thread = NamedThread(target=self._run, name="trimmer", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Wake the trimming thread if the RSS grew well past `_after` and stopped growing."""
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
            time.sleep(TRIM_EVERY_S)
