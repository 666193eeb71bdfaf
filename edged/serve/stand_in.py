"""The stand-in: a thread that serves the sockets while the loop's own thread runs a
backend call (edged.serve.lanes: an idle lane's job too dear for the inline path).

Why: a job handed to a lane's worker costs a wake-up of that worker's sleeping
thread, 60-70 us at p50 on the test VM, most of what the heavy model's round trip
spends beyond a naive single-thread server's (docs/benchmarks.md). Run on the thread
that decoded it, the job wakes nobody, but the sockets would go unread for the
call's length. So the stand-in sleeps in epoll_wait on a set that holds only its own
eventfd, and while the loop's thread is in a call the sockets' ZMQ_FDs and the
loop's wake eventfd join that set: the kernel wakes the stand-in only if a request,
a reply left in the outbox, a question or a signal's news arrives meanwhile. Then it
takes the loop's role (`Server.take_turn`) and serves. When nothing arrives, nothing
runs beside the call.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable


class StandIn:
    """The thread, and the set of file descriptors it sleeps on. `arm` and `disarm`
    are called by the loop's thread, around its call; `take_turn` runs on the stand-in."""

    def __init__(self, fds: list[int], take_turn: Callable[[], None], tick_s: float) -> None:
        self._fds = fds
        self._take_turn = take_turn
        self._tick_s = tick_s
        self._epoll = select.epoll()
        self._poke = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._poke, select.EPOLLIN)
        self._armed = False  # written by the loop's thread; a stale read costs one refused turn
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="stand-in", daemon=True)
        self._thread.start()

    def arm(self) -> None:
        """Watch the loop's file descriptors from now on (the loop's thread, before its call)."""
        for fd in self._fds:
            self._epoll.register(fd, select.EPOLLIN)
        self._armed = True

    def disarm(self) -> None:
        """Stop watching them (the loop's thread, after its call)."""
        self._armed = False
        for fd in self._fds:
            self._epoll.unregister(fd)

    def poke(self) -> None:
        """Take a turn now: something the file descriptors no longer signal is waiting."""
        os.eventfd_write(self._poke, 1)

    def stop(self) -> None:
        self._stopping = True
        self.poke()
        self._thread.join(1.0)
        self._epoll.close()
        os.close(self._poke)

    def _run(self) -> None:
        while not self._stopping:
            # A turn at least every tick while armed: the watchdog and housekeeping run on
            # whichever thread serves, and a call that never returns needs both. (Disarmed,
            # the timeout costs four idle wake-ups a second; arm() never wakes the stand-in.)
            self._epoll.poll(self._tick_s)
            try:
                os.eventfd_read(self._poke)
            except BlockingIOError:
                pass
            if self._armed and not self._stopping:
                self._take_turn()
