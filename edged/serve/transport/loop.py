"""A serving loop: one thread, the sockets it alone reads and writes, and the work
other threads hand it.

Each priority class has one (edged.daemon.loops starts them). It sleeps in zmq_poll
on its sockets and on an eventfd; it reads each request and hands it to its handler
(edged.serve.dispatch), which answers it, runs it inline or queues it for a worker, all
on this thread. Another thread never touches these sockets: a worker's reply, a request
handed over from the shared endpoint's loop, the daemon's switch to new lanes, all come
as callables appended to `_soon` with a write to the eventfd (`call_soon`), as asyncio's
`call_soon_threadsafe` does. So no socket has a lock and no thread stands in for another.

Why an eventfd beside a deque, not an inproc PAIR socket: bench/wake.py measured both
between two threads on this box (docs/benchmarks.md, "Wake-ups").
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from edged.serve.transport import Handler, Route
from edged.serve.transport.binding import Bound
from edged.serve.transport.turns import Turns
from edged.wire.codec import Buffer

log = logging.getLogger("edged.server")

# How many messages one socket may deliver before the loop turns to its other sockets
# and to what other threads handed it: a burst on one socket cannot starve a reply.
RECEIVE_BURST = 64
# How long a closing socket may take to flush the replies sent just before it closes.
CLOSE_LINGER_MS = 2000
# The loop's hand-off is the median of its latest HANDOFFS_KEPT wake-ups: one slow
# wake-up (a thread preempted, a start-up's warm-up holding the GIL) does not move it,
# and a box that stays busier moves it within that many.
HANDOFFS_KEPT = 15

# zmq's flags and options as plain ints: its enum members make every `&` a Python call.
_LAST, _EVENTS, _POLLIN = int(zmq.NOBLOCK), int(zmq.EVENTS), int(zmq.POLLIN)
_running = threading.local()  # .loop: the Loop whose thread this is


class Loop:
    """One serving thread. Its sockets (`bound`) and what `handle` keeps are used on
    its thread alone; other threads only call `call_soon`, `send` and `close`."""

    def __init__(
        self, name: str, bound: list[Bound], handle: Handler, turns: Turns | None = None, top: bool = True
    ) -> None:
        self.name = name
        self.bound = bound
        self._handle = handle
        self._turns = turns or Turns()
        self._top = top  # the highest class's loop, which the others give way to (edged.serve.transport.turns)
        # What this loop hands other loops during a turn, handed over at its end: one
        # wake-up of each for a whole burst, not one a message.
        self._outgoing: dict[Loop, list[tuple[Callable[..., Any], tuple[Any, ...]]]] = {}
        self._soon: deque[tuple[Callable[..., Any], tuple[Any, ...], int]] = deque()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name=f"serve-{name}", daemon=True)
        self._ident: int | None = None  # the thread's, once it runs: `send` compares it on every reply
        self._closing = False  # written by this loop's thread alone (in _finish)
        self.closed = threading.Event()
        self.lost = 0  # replies handed to it after it closed (none, when the daemon stops in order)
        # What waking this loop from another thread costs, measured on every such wake-up:
        # the price of a hand-off, which decides what runs inline (edged.serve.lanes.lane).
        self.handoff_ns = 0.0
        self._woken_ns: deque[int] = deque(maxlen=HANDOFFS_KEPT)
        self._asleep_since_ns = 0

    def start(self) -> None:
        self._thread.start()

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run `callback(*args)` on this loop's thread, soon (from any thread; from
        another loop, once that loop's turn ends)."""
        caller = getattr(_running, "loop", None)
        if caller is not None and caller is not self:
            caller._outgoing.setdefault(self, []).append((callback, args))
        else:
            self._take([(callback, args)])

    def _take(self, work: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
        if self.closed.is_set():
            self.lost += len(work)
            log.error("loop %s: work came after its sockets closed, and was dropped", self.name)
            return
        now_ns = time.monotonic_ns()
        self._soon.extend((callback, args, now_ns) for callback, args in work)
        os.eventfd_write(self._wake, 1)

    def _hand_over(self) -> None:
        """Hand the other loops what this turn made for them."""
        while self._outgoing:
            target, work = self._outgoing.popitem()
            target._take(work)

    def _give_way(self) -> None:
        """Between two messages or callables: wait while the highest class's loop is awake."""
        if self._turns.top_awake:
            self._hand_over()
            self._turns.wait()

    def send(self, route: Route, frames: list[Buffer]) -> None:
        """Send a reply on one of this loop's sockets: now on its own thread, else soon."""
        if threading.get_ident() == self._ident:
            self._send(route, frames)
        else:
            self.call_soon(self._send, route, frames)

    def close(self) -> None:
        """Read every socket dry, answer what was read, send every reply handed over, then
        close the sockets (from any thread; `closed` is set once done)."""
        self.call_soon(self._finish)

    def join(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the loop to close; whether it did. Its eventfd is
        closed here, not by the loop: a thread that found the loop open may still write it."""
        if not self.closed.wait(timeout_s):
            return False
        if self._wake >= 0:
            os.close(self._wake)
            self._wake = -1
        return True

    @property
    def unroutable(self) -> int:
        return sum(bound.unroutable for bound in self.bound)

    def _send(self, route: Route, frames: list[Buffer]) -> None:
        self.bound[route[1]].send(route[2], frames)

    def _run(self) -> None:
        self._ident = threading.get_ident()
        poller = zmq.Poller()
        for bound in self.bound:
            poller.register(bound.sock, zmq.POLLIN)
        poller.register(self._wake, zmq.POLLIN)
        socks = [bound.sock for bound in self.bound]
        _running.loop = self
        turns, top = self._turns, self._top
        try:
            while not self._closing:
                # No timeout: whatever a loop must do comes as a message or a callable.
                self._asleep_since_ns = time.monotonic_ns()
                if top:
                    turns.sleep()
                ready = dict(poller.poll())
                if top:
                    turns.wake()
                if self._wake in ready:
                    os.eventfd_read(self._wake)
                self._run_soon()
                for index, sock in enumerate(socks):
                    if sock in ready:
                        self._receive(index, RECEIVE_BURST)
                self._hand_over()
            # The last turn: what reached a socket before it closes is answered
            # (the daemon is stopping: an inference request gets UNAVAILABLE).
            for index in range(len(socks)):
                self._receive(index, None)
            self._run_soon()
            self._hand_over()
        finally:
            if top:
                turns.sleep()
            for sock in socks:
                sock.close(linger=CLOSE_LINGER_MS)
            self.closed.set()

    def _run_soon(self) -> None:
        soon = self._soon
        if soon and soon[0][2] >= self._asleep_since_ns:  # it woke this loop from its sleep
            self._woken_ns.append(time.monotonic_ns() - soon[0][2])
            self.handoff_ns = float(statistics.median(self._woken_ns))
        self._asleep_since_ns = 1 << 62  # until the next sleep: what waits now did not wake it
        while soon:
            if not self._top:
                self._give_way()
            callback, args, _ = soon.popleft()
            try:
                callback(*args)
            except Exception:  # a bug in one callback must not take the loop, or the others, with it
                log.exception("loop %s: a callback failed", self.name)

    def _finish(self) -> None:
        self._closing = True

    def _receive(self, index: int, most: int | None) -> None:
        """Read and handle up to `most` messages from socket `index` (None: until it is
        empty), each read before the one ahead of it is handled: the handler learns
        whether another waits behind it (a lane then batches rather than runs inline)."""
        sock, handle = self.bound[index].sock, self._handle
        count = 1
        current = _read(sock)
        while current is not None:
            if not self._top:
                self._give_way()
            # The first look asks whether a message waits (the look behind a lone request
            # mostly finds none, and the ask costs a third of a receive that finds none);
            # once one was found, a burst is being read, and the next look receives at once.
            following = _read(sock) if (most is None or count < most) and (count > 1 or _waiting(sock)) else None
            count += 1
            frames, received_ns = current
            # A REQ peer's envelope ends with an empty delimiter frame, and so must its reply.
            cut = 2 if len(frames) > 1 and len(frames[1]) == 0 else 1
            handle((self, index, frames[:cut]), [f.buffer for f in frames[cut:]], received_ns, following is not None)
            current = following


def _waiting(sock: zmq.Socket) -> bool:
    """Whether a message waits on `sock`: a third of what a receive that finds none costs
    (its exception), and the look behind each request mostly finds none."""
    return bool(sock.getsockopt(_EVENTS) & _POLLIN)


def _read(sock: zmq.Socket) -> tuple[list[zmq.Frame], int] | None:
    """One message and when it was read, or None when none waits."""
    try:
        frames = [sock.recv(_LAST, copy=False)]
    except zmq.Again:
        return None
    while frames[-1].more:  # the parts of one message arrive together
        frames.append(sock.recv(_LAST, copy=False))
    return frames, time.monotonic_ns()
