"""A serving loop: one thread per class, the only one that touches its sockets. It polls
them, the ends of their ipc connections and an eventfd, and hands each request to its
handler (edged.serve.dispatch).
Other threads hand it work as callables (`call_soon`: a deque plus an eventfd write;
docs/benchmarks.md, "A hand-off between threads"), so no socket needs a lock."""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from edged.serve.transport import Handler, Route
from edged.serve.transport.binding import Bound
from edged.serve.transport.spin import Spin
from edged.serve.transport.turns import Turns
from edged.threads import NamedThread
from edged.wire.codec import Buffer

log = logging.getLogger("edged.server")

# Messages read from one socket before the loop turns to the others: a burst cannot starve a reply.
RECEIVE_BURST = 64
# Time a closing socket has to flush the replies sent just before.
CLOSE_LINGER_MS = 2000
# A closing loop reads its sockets dry, or for this long where clients keep sending: then it
# closes them (what a flood sends on goes unread), so that no client can hold a stop for ever.
LAST_TURN_NS = 1_000_000_000
# handoff_ns is a median over this many wake-ups: one slow wake-up does not move it, a busier box does.
HANDOFFS_KEPT = 15

_running = threading.local()  # .loop: the Loop whose thread this is
Work = tuple[Callable[..., Any], tuple[Any, ...]]  # a callable handed to a loop, and its arguments


class Loop:
    """One serving thread. `bound` and what `handle` keeps are its thread's alone;
    other threads only call `call_soon`, `send` and `close`."""

    def __init__(
        self,
        name: str,
        bound: list[Bound],
        handle: Handler,
        turns: Turns | None = None,
        top: bool = True,
        spin: Spin | None = None,
        quiet: Callable[[], bool] = lambda: True,
    ) -> None:
        self.name = name
        self.bound = bound
        self._handle = handle
        self._turns = turns or Turns()
        self._top = top  # the highest class's loop, which the others give way to
        self._above = None if top else self._turns  # the turns this loop gives way in
        self.spin = spin or Spin(0)
        self._quiet = quiet  # whether nothing else in the daemon has work: a spin may start or go on
        self.blocked = False  # asleep in its poll (not spinning): written by this loop's thread alone
        # Work for other loops, handed over at the turn's end: one wake-up per burst, not per message.
        self._outgoing: dict[Loop, list[Work]] = {}
        # Batches as handed over, each stamped when it came: a burst's hop costs one entry, not one per message.
        self._soon: deque[tuple[int, list[Work]]] = deque()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # Held while work is handed over, and by the loop as it closes and `join` as it closes the
        # eventfd: work is either run, or counted lost, and no write reaches a descriptor reused.
        self._handing = threading.Lock()
        self._serving = NamedThread(target=self._run, name=f"serve-{name}", daemon=True)
        self._ident: int | None = None
        self._closing = False  # written by this loop's thread alone (in _finish)
        self.closed = threading.Event()
        self.lost = 0  # work handed to it after it closed
        # What a wake-up from another thread costs: decides what runs inline (edged.serve.lanes.lane).
        self.handoff_ns = 0.0
        self._woken_ns: deque[int] = deque(maxlen=HANDOFFS_KEPT)
        self._asleep_since_ns = 0

    def start(self) -> None:
        self._serving.start()

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run `callback(*args)` on this loop's thread soon; from another loop, after that loop's turn."""
        caller = getattr(_running, "loop", None)
        if caller is None or caller is self:
            self._take([(callback, args)])
        elif (batch := caller._outgoing.get(self)) is not None:
            batch.append((callback, args))
        else:
            caller._outgoing[self] = [(callback, args)]

    def _take(self, work: list[Work]) -> None:
        with self._handing:
            if self.closed.is_set():
                self.lost += len(work)
                log.error("loop %s: work came after its sockets closed, and was dropped", self.name)
                return
            self._soon.append((time.monotonic_ns(), work))
            os.eventfd_write(self._wake, 1)

    def _hand_over(self) -> None:
        while self._outgoing:
            target, work = self._outgoing.popitem()
            target._take(work)

    def _give_way(self) -> None:
        """Wait while the highest class's loop is awake (edged.serve.transport.turns)."""
        self._hand_over()
        self._turns.wait()

    def send(self, route: Route, frames: list[Buffer]) -> bool:
        """Send a reply: now on this loop's thread, else through `call_soon`. False: sent
        now to a peer known to be gone (counted unroutable)."""
        if threading.get_ident() == self._ident:
            return self.bound[route[1]].send(route[2], frames)
        self.call_soon(self.bound[route[1]].send, route[2], frames)
        return True

    def close(self) -> None:
        """Read the sockets dry, answer, send what was handed over, then close; sets `closed`."""
        self.call_soon(self._finish)

    def join(self, timeout_s: float) -> bool:
        """Whether the loop closed within `timeout_s`; then its eventfd is closed too."""
        if not self.closed.wait(timeout_s):
            return False
        with self._handing:
            if self._wake >= 0:
                os.close(self._wake)
                self._wake = -1
        return True

    @property
    def unroutable(self) -> int:
        return sum(bound.unroutable for bound in self.bound)

    def _run(self) -> None:
        self._ident = threading.get_ident()
        poller = zmq.Poller()
        for bound in self.bound:
            poller.register(bound.sock, zmq.POLLIN)
        poller.register(self._wake, zmq.POLLIN)
        socks = [bound.sock for bound in self.bound]
        monitors = [(index, bound.monitor) for index, bound in enumerate(self.bound) if bound.monitor is not None]
        for _, monitor in monitors:
            poller.register(monitor, zmq.POLLIN)
        _running.loop = self
        turns, top, read = self._turns, self._top, False
        try:
            while not self._closing:
                # No timeout: all work comes as a message or a callable.
                turn_end_ns = self._asleep_since_ns = time.monotonic_ns()
                if read:  # however long its requests took, a loop that served them is not idle
                    self.spin.served(turn_end_ns)
                if top:
                    turns.sleep()
                ready = self._wait(poller)
                if top:
                    turns.top_awake = True
                if read := not ready.keys().isdisjoint(socks):
                    now_ns = time.monotonic_ns()
                    self.spin.arrived(now_ns - turn_end_ns, now_ns)
                if self._wake in ready:
                    os.eventfd_read(self._wake)
                self._run_soon()
                for index, monitor in monitors:
                    if monitor in ready:
                        self._closed(index)
                for index, sock in enumerate(socks):
                    if sock in ready:
                        self._receive(index, RECEIVE_BURST)
                self._hand_over()
            # Last turn: answer what reached the sockets (inference gets UNAVAILABLE), which
            # needs no precedence: the other loops need not wait for it.
            if top:
                turns.sleep()
            until_ns = time.monotonic_ns() + LAST_TURN_NS
            # In turns, a burst each: one flooded socket must not keep the others unread.
            while (waiting := [i for i, b in enumerate(self.bound) if b.waiting()]) and time.monotonic_ns() < until_ns:
                for index in waiting:
                    self._receive(index, RECEIVE_BURST)
            self._run_soon()
            self._hand_over()
        finally:
            if top:
                turns.sleep()
            for index, monitor in monitors:
                # A loop given up on at a stop may close after the context has gone: its sockets with it.
                with contextlib.suppress(zmq.ZMQError):
                    self.bound[index].sock.disable_monitor()
                monitor.close(linger=0)
            for sock in socks:
                sock.close(linger=CLOSE_LINGER_MS)
            with self._handing:
                self.closed.set()
                if self._soon:  # handed over after the last turn ran what it had
                    self.lost += sum(len(work) for _, work in self._soon)
                    log.error("loop %s: work came as its sockets closed, and was dropped", self.name)

    def _wait(self, poller: zmq.Poller) -> dict[Any, int]:
        """What is ready: polled for up to the spin's length while the daemon is quiet, then slept for."""
        if (spin_ns := self.spin.length_ns(self._asleep_since_ns)) and self._quiet():
            until_ns = self._asleep_since_ns + spin_ns
            # Awake: work handed over meanwhile woke nothing, and says nothing of what a wake-up costs.
            self._asleep_since_ns = 1 << 62
            if ready := self.spin.poll(poller, until_ns, self._quiet):
                return dict(ready)
            self._asleep_since_ns = time.monotonic_ns()
        self.blocked = True
        ready = poller.poll()
        self.blocked = False
        return dict(ready)

    def _run_soon(self) -> None:
        soon = self._soon
        if soon and soon[0][0] >= self._asleep_since_ns:  # this work woke the loop
            self._woken_ns.append(time.monotonic_ns() - soon[0][0])
            self.handoff_ns = float(statistics.median(self._woken_ns))
        self._asleep_since_ns = 1 << 62  # until the next sleep, new work did not wake the loop
        above = self._above
        while soon:
            for callback, args in soon.popleft()[1]:
                if above is not None and above.top_awake:
                    self._give_way()
                try:
                    callback(*args)
                except Exception:  # one callback's bug must not take the loop down
                    log.exception("loop %s: a callback failed", self.name)

    def when_closed(self, index: int, envelope: zmq.Frame, callback: Callable[[bytes], None], peer: bytes) -> bytes:
        """The connection `envelope` came on (its peer and its descriptor); `callback` is called with
        it here once it closes (an ipc socket's; else never). The ends already told are acted on
        first: a descriptor reused since names a new connection."""
        if threading.get_ident() != self._ident:
            thread = threading.current_thread().name
            raise RuntimeError(f"loop {self.name} watches its connections on its own thread, not {thread!r}")
        bound, descriptor = self.bound[index], envelope.get(zmq.SRCFD)
        connection = peer + b"\0" + str(descriptor).encode()
        if bound.monitor is not None:
            self._closed(index)
            bound.closing.setdefault(descriptor, {})[connection] = callback
        return connection

    def _closed(self, index: int) -> None:
        """Act on the connections of socket `index` that ZeroMQ has told closed."""
        bound = self.bound[index]
        assert bound.monitor is not None
        while True:
            try:
                event = parse_monitor_message(bound.monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            if event["event"] != zmq.EVENT_DISCONNECTED:
                continue
            for connection, callback in bound.closing.pop(int(event["value"]), {}).items():
                try:
                    callback(connection)
                except Exception:  # one callback's bug must not take the loop down
                    log.exception("loop %s: a callback at a connection's end failed", self.name)

    def _finish(self) -> None:
        self._closing = True

    def _receive(self, index: int, most: int) -> None:
        """Handle up to `most` messages. Each is read before the one ahead is handled, so
        the handler knows whether another waits (a lane then batches)."""
        bound, handle, above = self.bound[index], self._handle, self._above
        count = 1
        current = bound.read()
        while current is not None:
            if above is not None and above.top_awake:
                self._give_way()
            # Once a second message was found, a burst is being read: receive without asking first.
            following = bound.read() if count < most and (count > 1 or bound.waiting()) else None
            count += 1
            frames, received_ns = current
            # A REQ peer's envelope ends with an empty delimiter, and so must its reply's.
            cut = 2 if len(frames) > 1 and len(frames[1]) == 0 else 1
            handle((self, index, frames[:cut]), [f.buffer for f in frames[cut:]], received_ns, following is not None)
            current = following
