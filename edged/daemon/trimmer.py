"""Memory a burst leaves behind, given back to the system off the serving threads.

A burst's messages are allocated by ZeroMQ's I/O thread faster than the loop reads and
sheds them: hundreds of MiB at once. Freed, they stay resident, since the allocator
keeps what it cannot return from the top of a heap (after 500 peers' burst of 490 MB:
106 MiB before, 284 MiB 1 s after). glibc's `malloc_trim` gives those pages back, but
took 14 ms to free 170 MiB: on the socket loop, a realtime request would wait that
long. So it runs on a thread of its own, with the GIL released (ctypes releases it
around a foreign call), and only once the RSS has stopped growing: after the burst, not
in it. A thread that allocates or frees meanwhile in the arena being trimmed still
waits for it (the loop frees the messages that ZeroMQ's thread allocated), once, after
the burst. The thread keeps the daemon's priority: at nice 19 it was preempted while it
held an arena's lock, and the loop waited behind it (realtime's p99 beside the burst
6.8-8.5 ms in 3 runs, against 6.1-6.3 without a trimmer; at nice 0, 5.8-6.4 against 6.2-6.4).

Returning freed messages at once instead (a fixed `M_MMAP_THRESHOLD` below their size)
was tried and not kept: RSS 1.2x after the burst, but every message then costs an mmap
on ZeroMQ's thread and an munmap on the loop (the loop's CPU in the burst 0.66-0.75 s
against 0.5), and a large tensor faults in every page on every request.

The figures: bench/burst.py on the 2-core VM, 2026-11-25 (docs/benchmarks-history.md,
"Bursts: what the burst leaves resident, given back").
"""

from __future__ import annotations

import threading
import time

from edged.backends.host_memory import rss_bytes, trim

CHECK_EVERY_NS = 1_000_000_000
GROWTH = 1.25  # RSS past this multiple of its value after the last trim...
MIN_GROWTH_BYTES = 32 * 1024 * 1024  # ...and by at least this much, asks for a trim


class Trimmer:
    """`check` (the serving thread's housekeeping, at most once a second) reads the RSS and
    wakes the trimming thread when it has grown; the thread alone writes `_after`."""

    def __init__(self) -> None:
        self._after = rss_bytes()  # the RSS after the last trim
        self._last = self._after  # the RSS at the last check
        self._next_check_ns = 0
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="trimmer", daemon=True)
        self._thread.start()

    def check(self, now_ns: int) -> None:
        """Wake the trimming thread if the RSS grew well past its value after the last trim,
        and has stopped growing."""
        if now_ns < self._next_check_ns:
            return
        self._next_check_ns = now_ns + CHECK_EVERY_NS
        rss, last = rss_bytes(), self._last
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
