"""The socket loop: ROUTER sockets in, replies out. With edged.serve.transport.binding
and .curve, the only daemon modules that import zmq.

A blocking poll in one thread rather than asyncio: its round trips took about half
of zmq.asyncio's on uvloop (docs/benchmarks.md, "Figures behind the code").

The loop reads the sockets; a lane worker sends its own replies, so that a reply
costs no second thread hand-off. A ZeroMQ socket is not thread-safe, but may pass
between threads behind a full memory barrier: every use of a socket (receive, send,
its EVENTS) holds that socket's lock. So the loop never sleeps inside zmq_poll, which
would use a socket unlocked: it sleeps in poll(2) on each socket's ZMQ_FD and on an
eventfd. ZMQ_FD signals edges, and any use of a socket (a worker's send too) may take
the edge of a message that arrived: so the loop reads each socket's EVENTS, under its
lock, before it sleeps, and a worker that finds a message waiting after its send
wakes the loop. A worker never waits for the lock: one that finds it taken (the loop
is reading) leaves the reply in the loop's outbox.
Being the loop is a role, held as a lock: by the thread that called `run`, except
while that thread runs a backend call itself (`run_aside`), when the stand-in
(edged.serve.transport.stand_in) may take it to serve what arrives meanwhile.
"""

from __future__ import annotations

import logging
import os
import select
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator

from edged.config import SecurityConfig
from edged.serve.transport import Handler, Route, Steering
from edged.serve.transport.binding import Bound, SocketOptions, bind
from edged.serve.transport.curve import server_keys, start_authenticator
from edged.serve.transport.stand_in import LoopRole
from edged.wire.codec import Buffer
from edged.wire.endpoints import class_endpoint

log = logging.getLogger("edged.server")

# How many messages one socket may deliver before the loop turns to its other sockets,
# the questions asked of it and its housekeeping.
RECEIVE_BURST = 64
# While it reads a socket, the loop looks at the sockets of higher classes after this
# many messages, and reads them first: a realtime request waits behind at most this
# many of a burst on a lower socket, not behind one message from every busy peer.
PRIORITY_EVERY = 4

# zmq's flags as plain ints: its enum members make every `&` and `|` a Python call.
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
_LAST = int(zmq.NOBLOCK)


class Server:
    """The daemon's sockets and the loop that reads them. Any thread sends a reply
    (`reply`), under the socket's lock, or leaves it in the outbox; any thread appends
    a question (`ask`); only the loop takes either off.

    With `classes` given, each ipc endpoint gets a socket per class beside it
    (edged.wire.endpoints.class_endpoint), in class order; the loop reads them before
    the shared sockets, and a higher class's before a lower's."""

    def __init__(
        self,
        endpoints: tuple[str, ...],
        max_message_bytes: int,
        *,
        ipc_mode: int = 0o660,
        ipc_group: int | None = None,
        security: SecurityConfig | None = None,
        classes: tuple[str, ...] = (),
    ) -> None:
        # Refuse an unsafe or unreadable key set before anything is bound.
        curve = server_keys(endpoints, security or SecurityConfig())
        self._options = SocketOptions(max_message_bytes, ipc_mode, ipc_group, curve)
        # A second I/O thread reads the class sockets: the first may be busy copying a burst.
        self._context = zmq.Context(io_threads=2 if classes else 1)
        self._bound: list[Bound] = []
        self._closed = False  # written under every lock: no reply is sent after close
        self._outbox: deque[tuple[Route, list[Buffer]]] = deque()
        self._asks: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._role = LoopRole()
        # Set while the daemon drains: its loop learns at once that a worker answered.
        self.wake_on_reply = False
        self.endpoints = endpoints
        self._ingress: dict[str, list[str]] = {}
        self._authenticator: ThreadAuthenticator | None = None
        try:
            if curve is not None:
                # Before any bind: a CURVE socket with no ZAP handler refuses every client.
                self._authenticator = start_authenticator(self._context, curve.allowed_clients_dir)
            for rank, klass in enumerate(classes):
                for shared in endpoints:
                    if (own := class_endpoint(shared, klass)) is not None:
                        self._bind(own, klass, rank, io_thread=1)
                        self._ingress.setdefault(klass, []).append(own)
            for endpoint in endpoints:
                self._bind(endpoint, None, len(classes))
            for bound in self._bound:
                bound.higher = tuple(i for i, other in enumerate(self._bound) if other.rank < bound.rank)
        except Exception:
            self.close()
            raise
        if curve is not None:
            log.info("tcp endpoints use CURVE; clients served: the keys in %s", curve.allowed_clients_dir)

    def _bind(self, endpoint: str, klass: str | None, rank: int, io_thread: int = 0) -> None:
        sock = bind(self._context, endpoint, self._options, io_thread)
        self._bound.append(Bound(sock, klass, rank, local=endpoint.startswith("ipc://")))

    @property
    def ingress(self) -> dict[str, list[str]]:
        """By class: the endpoints of its own sockets."""
        return self._ingress

    @property
    def unroutable(self) -> int:
        """Replies whose peer was gone or not reading."""
        return sum(bound.unroutable for bound in self._bound)

    def reply(self, route: Route, frames: list[Buffer]) -> None:
        """Send a reply now, under the socket's lock. Off the loop, only when the lock is
        free at once: a worker that waited for it would then wait for the GIL, which the
        loop holds; the reply goes through the outbox instead, which the loop, awake, sends."""
        index = route[0]
        lock = self._bound[index].lock
        on_loop = self._role.here
        if not lock.acquire(blocking=on_loop):
            self._outbox.append((route, frames))
            os.eventfd_write(self._wake_fd, 1)
            return
        try:
            if self._closed:
                return
            self._bound[index].send(route[1], frames)
            # The send may have taken the edge that would wake the loop for a message
            # that has since arrived (the loop itself reads EVENTS before it sleeps).
            if not on_loop and (self._bound[index].sock.getsockopt(_EVENTS) & _POLLIN or self.wake_on_reply):
                os.eventfd_write(self._wake_fd, 1)
        finally:
            lock.release()

    def peer(self, route: Route) -> bytes:
        """The routing id ZeroMQ gave the sending connection."""
        return route[1][0].bytes

    def local(self, route: Route) -> bool:
        return self._bound[route[0]].local

    def flush(self) -> None:
        """Send the replies that found a socket busy."""
        outbox = self._outbox
        while outbox:
            self.reply(*outbox.popleft())

    def ask(self, question: Callable[[], Any], timeout_s: float) -> Any:
        """Run `question` on the loop's thread and return its answer (from any other
        thread): how a reader reaches state that only the loop owns."""
        answer: Future[Any] = Future()
        self._asks.append((question, answer))
        os.eventfd_write(self._wake_fd, 1)
        return answer.result(timeout_s)

    def wake(self) -> None:
        """Make the loop look at its stop condition now (safe from signal handlers)."""
        os.eventfd_write(self._wake_fd, 1)

    def run_aside(self, call: Callable[[], None]) -> bool:
        """Run `call` here, on the loop's own thread, with the stand-in watching the
        sockets meanwhile; False (and `call` not run) on any other thread, or before `run`."""
        # Armed after the loop last read them, the sockets' signals may already be spent.
        return self._role.run_aside(call, lambda: bool(self._readable()))

    def run(self, steering: Steering, tick_ms: int) -> None:
        """Serve until `steering.keep_running()` is false; `steering.tick` runs after every
        wake-up and at least every `tick_ms`. Before sleeping, the loop polls without
        sleeping until `steering.spin_deadline_ns()`, if that is to come."""
        poller = select.poll()
        by_fd = {}  # each socket's ZMQ_FD: its index
        for index, bound in enumerate(self._bound):
            with bound.lock:
                fd = bound.sock.getsockopt(zmq.FD)
            by_fd[fd] = index
            poller.register(fd, select.POLLIN)
        poller.register(self._wake_fd, select.POLLIN)
        self._role.take()
        try:
            self._role.serve_with([*by_fd, self._wake_fd], lambda: self._stand_in_turn(steering), tick_ms / 1000)
            while steering.keep_running():
                # Level, not edge: a socket that holds a message is read before any sleep.
                ready = self._readable() or self._sleep(poller, by_fd, steering.spin_deadline_ns(), tick_ms)
                self._turn(ready, steering.handle, steering.tick)
        finally:
            self._role.give_up()

    def _sleep(self, poller: select.poll, by_fd: dict[int, int], deadline_ns: int, tick_ms: int) -> list[int]:
        """Wait for a socket's signal, the wake eventfd or `tick_ms`, polling without
        sleeping until `deadline_ns` first; the sockets to read (by index)."""
        # A request that finds the loop awake skips the kernel's wake-up of an idle core
        # and runs on warm caches (docs/benchmarks.md: the light request's p50 nearly
        # halved). Only while lanes are idle: it costs their CPU.
        events = []
        while deadline_ns and not events and time.monotonic_ns() < deadline_ns:
            events = poller.poll(0)
            if not events:
                # The request comes through ZeroMQ's I/O thread: queued behind the spin
                # on this core, it waited out the spin (docs/benchmarks.md: the light p99
                # fell by about a third with the yield).
                os.sched_yield()
        if not events:
            events = poller.poll(tick_ms)
        # A socket's own signal: read it at once (a signal with no message costs one
        # zmq.Again). The wake eventfd may stand for a signal a worker's send took.
        ready = sorted(by_fd[fd] for fd, _ in events if fd != self._wake_fd)
        if len(ready) < len(events):
            self._drain_wake()
            ready = self._readable()
        return ready

    def _turn(self, ready: list[int], handle: Handler, tick: Callable[[], None]) -> None:
        """What the loop does when it wakes (holding the role): `tick`, then read the
        sockets in `ready`, send the outbox and answer the questions. The tick comes
        first: news it acts on (a stop signal that interrupted the sleep) came before
        these requests, which must be answered as the daemon now is (draining, say)."""
        tick()
        for index in ready:
            self._receive(index, handle)
        self.flush()
        while self._asks:
            question, answer = self._asks.popleft()
            try:
                answer.set_result(question())
            except Exception as exc:
                answer.set_exception(exc)

    def _stand_in_turn(self, steering: Steering) -> None:
        """The stand-in's turn, holding the role: whatever woke it, read everything."""
        self._drain_wake()
        self._turn(self._readable(), steering.handle, steering.serve_tick)

    def _drain_wake(self) -> None:
        try:
            os.eventfd_read(self._wake_fd)
        except BlockingIOError:  # already read by the other thread
            pass

    def _readable(self) -> list[int]:
        """The sockets that hold a message (by index, so a higher class's first)."""
        return self._holding(range(len(self._bound)))

    def _holding(self, indices: Iterable[int]) -> list[int]:
        ready = []
        for index in indices:
            bound = self._bound[index]
            with bound.lock:
                if bound.sock.getsockopt(_EVENTS) & _POLLIN:
                    ready.append(index)
        return ready

    def close(self) -> None:
        if self._authenticator is not None:
            self._authenticator.stop()
        for bound in self._bound:
            bound.lock.acquire()
        try:
            self._closed = True
            self._context.destroy(linger=0)  # every socket, even one whose bind failed
        finally:
            for bound in self._bound:
                bound.lock.release()
        os.close(self._wake_fd)

    def _receive(self, index: int, handle: Handler) -> None:
        bound = self._bound[index]
        sock, lock, higher = bound.sock, bound.lock, bound.higher
        for burst in range(RECEIVE_BURST):
            if higher and burst and burst % PRIORITY_EVERY == 0:
                for first in self._holding(higher):
                    self._receive(first, handle)
            with lock:
                # EVENTS or the socket's signal has just said the first message is there. For the
                # next ones, asking (1 us) is cheaper than the zmq.Again an empty socket raises.
                if burst and not sock.getsockopt(_EVENTS) & _POLLIN:
                    return
                try:
                    frames = [sock.recv(_LAST, copy=False)]
                except zmq.Again:  # a signal with no message behind it: nothing to read
                    return
                while frames[-1].more:  # the parts of one message arrive together
                    frames.append(sock.recv(_LAST, copy=False))
            received_ns = time.monotonic_ns()
            # A REQ peer's envelope ends with an empty delimiter frame, and so must its reply.
            cut = 2 if len(frames) > 1 and len(frames[1]) == 0 else 1
            handle((index, frames[:cut]), [frame.buffer for frame in frames[cut:]], received_ns, bound.klass)
