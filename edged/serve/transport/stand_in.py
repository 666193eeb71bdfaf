"""The stand-in: a thread that serves the sockets while the loop's own thread runs a
backend call (edged.serve.lanes.lane: an idle lane's job too dear for the inline path).

Why: a job handed to a lane's worker costs a wake-up of that worker's sleeping
thread, most of what the heavy model's round trip spent beyond a naive
single-thread server's (docs/benchmarks.md). Run on the thread
that decoded it, the job wakes nobody, but the sockets would go unread for the
call's length. So the stand-in sleeps in epoll_wait on a set that holds only its own
eventfd, and while the loop's thread is in a call the sockets' ZMQ_FDs and the
loop's wake eventfd join that set: the kernel wakes the stand-in only if a request,
a reply left in the outbox, a question or a signal's news arrives meanwhile. Then it
takes the loop's role (LoopRole) and serves. When nothing arrives, nothing runs beside
the call.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable


class LoopRole:
    """Who is the socket loop: a lock, held by the thread that called `Server.run`
    except while that thread runs a call itself (`run_aside`), when the stand-in may
    take it for a turn. Whoever holds it owns the loop's state; `holder` is written only
    by the holder (None while nobody holds it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.holder: int | None = None
        self._main: int | None = None
        self._stand_in: StandIn | None = None

    @property
    def here(self) -> bool:
        """Whether the calling thread holds the role."""
        return threading.get_ident() == self.holder

    def take(self) -> None:
        """Become the loop (the thread that runs it, once)."""
        self._lock.acquire()
        self._main = self.holder = threading.get_ident()

    def serve_with(self, fds: list[int], turn: Callable[[], None], tick_s: float) -> None:
        """Start the stand-in: `turn` is what it does with the role when `fds` wake it."""
        self._stand_in = StandIn(fds, lambda: self._stand_in_turn(turn), tick_s)

    def give_up(self) -> None:
        """Stop being the loop, and stop the stand-in (the loop's thread, at the end)."""
        self.holder = None
        self._lock.release()
        if self._stand_in is not None:
            self._stand_in.stop()
            self._stand_in = None

    def run_aside(self, call: Callable[[], None], pending: Callable[[], bool]) -> bool:
        """Run `call` on the loop's own thread with the stand-in watching meanwhile; False
        (and `call` not run) on any other thread or before the stand-in started.
        `pending`: whether something already waits that the file descriptors will not signal."""
        stand_in = self._stand_in
        if stand_in is None or threading.get_ident() != self._main or self.holder is None:
            return False
        stand_in.arm()
        self.holder = None
        self._lock.release()
        try:
            if pending():
                stand_in.poke()
            call()
        finally:
            stand_in.disarm()
            self._lock.acquire()
            self.holder = self._main
        return True

    def _stand_in_turn(self, turn: Callable[[], None]) -> None:
        """The stand-in's turn, if the role is free (its thread is back from its call otherwise)."""
        if not self._lock.acquire(blocking=False):
            return
        self.holder = threading.get_ident()
        try:
            turn()
        finally:
            self.holder = None
            self._lock.release()


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
