"""The socket loop: ROUTER sockets in, replies out. With edged.serve.transport.binding (binding
them) and edged.serve.transport.curve (CURVE set-up), the only daemon modules that import zmq.

Why a blocking zmq.Poller in one thread rather than asyncio: its round trips took
about half of zmq.asyncio's on uvloop, and a third of the default loop's
(docs/benchmarks.md, "Figures behind the code"). The hot path cannot afford the event loop.

The loop reads the sockets; a lane worker sends its own replies, so that a reply
costs no second thread hand-off (the worker's wake-up of the loop, then the GIL:
docs/benchmarks.md measured it on the heavy model). A ZeroMQ socket is not
thread-safe, but may pass between threads behind a full memory barrier: every use
of a socket (receive, send, its EVENTS) holds that socket's lock. The loop must then
never sleep inside zmq_poll on a socket, which would use it unlocked: it sleeps in
poll(2) on each socket's ZMQ_FD and on an eventfd. ZMQ_FD signals edges, and any
use of a socket (a worker's send too) may take the edge of a message that arrived:
so the loop reads each socket's EVENTS, under its lock, before it sleeps, and a
worker that finds a message waiting after its send wakes the loop. A worker never
waits for the lock: one that finds it taken (the loop is reading) hands the reply
to the loop through an outbox, as every reply went before.
Being the loop is a role, held as a lock: by the thread that called `run`, except
while that thread runs a backend call itself (`run_aside`), when a stand-in thread
(edged.serve.transport.stand_in) may take it to serve what arrives meanwhile.
With CURVE configured, a ZAP thread (edged.serve.transport.curve) checks each tcp handshake;
it never sees the messages that follow.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

import zmq
from zmq.auth.thread import ThreadAuthenticator

from edged.config import SecurityConfig
from edged.serve.transport.binding import SocketOptions, bind
from edged.serve.transport.curve import server_keys, start_authenticator
from edged.serve.transport.stand_in import LoopRole
from edged.wire.codec import Buffer

log = logging.getLogger("edged.server")

# How many messages one socket may deliver before the loop turns to its other sockets,
# the questions asked of it and its housekeeping.
RECEIVE_BURST = 64

# zmq's flags as plain ints: its enum members make every `&` and `|` a Python call.
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
_MORE, _LAST = int(zmq.SNDMORE | zmq.NOBLOCK), int(zmq.NOBLOCK)

Route = tuple[int, list[Any]]  # (socket index, routing envelope)
Handler = Callable[[Route, list[Buffer], int], None]


class Steering(Protocol):
    """What the daemon gives the socket loop (`Server.run`): `handle` answers or admits a
    request; `keep_running` is asked before each sleep; `tick` is the loop's own thread's
    turn after every wake-up, and it alone steers the daemon; `serve_tick` is the
    stand-in's turn in its place, which serves and never steers; `spin_deadline_ns` says
    until when to poll rather than sleep (0: sleep now)."""

    def handle(self, route: Route, frames: list[Buffer], received_ns: int) -> None: ...
    def keep_running(self) -> bool: ...
    def tick(self) -> None: ...
    def serve_tick(self) -> None: ...
    def spin_deadline_ns(self) -> int: ...


class Server:
    """The daemon's sockets and the loop that reads them. Any thread sends a reply
    (`reply`), under the socket's lock, or leaves it in the outbox; any thread appends
    a question (`ask`); only the loop takes either off."""

    def __init__(
        self,
        endpoints: tuple[str, ...],
        max_message_bytes: int,
        *,
        ipc_mode: int = 0o660,
        ipc_group: int | None = None,
        security: SecurityConfig | None = None,
    ) -> None:
        # Refuse an unsafe or unreadable key set before anything is bound.
        curve = server_keys(endpoints, security or SecurityConfig())
        self._options = SocketOptions(max_message_bytes, ipc_mode, ipc_group, curve)
        self._context = zmq.Context()
        self._sockets: list[zmq.Socket] = []
        # Per socket: every use of it holds its lock, and only holders write its count
        # of unroutable replies.
        self._locks: list[threading.Lock] = []
        self._unroutable: list[int] = []
        self._closed = False  # written under every lock: no reply is sent after close
        self._outbox: deque[tuple[Route, list[Buffer]]] = deque()
        self._asks: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._role = LoopRole()
        # Set while the daemon drains: its loop learns at once that a worker answered.
        self.wake_on_reply = False
        self.endpoints = endpoints
        self._authenticator: ThreadAuthenticator | None = None
        try:
            if curve is not None:
                # Before any bind: a CURVE socket with no ZAP handler refuses every client.
                self._authenticator = start_authenticator(self._context, curve.allowed_clients_dir)
            for endpoint in endpoints:
                self._sockets.append(bind(self._context, endpoint, self._options))
                self._locks.append(threading.Lock())
                self._unroutable.append(0)
        except Exception:
            self.close()
            raise
        if curve is not None:
            log.info("tcp endpoints use CURVE; clients served: the keys in %s", curve.allowed_clients_dir)

    @property
    def unroutable(self) -> int:
        """Replies whose peer was gone or not reading."""
        return sum(self._unroutable)

    def reply(self, route: Route, frames: list[Buffer]) -> None:
        """Send a reply now, under the socket's lock. Off the loop, only when the lock is
        free at once: a worker that waited for it would then wait for the GIL, which the
        loop holds; the reply goes through the outbox instead, which the loop, awake, sends."""
        index = route[0]
        lock = self._locks[index]
        on_loop = self._role.here
        if not lock.acquire(blocking=on_loop):
            self._outbox.append((route, frames))
            os.eventfd_write(self._wake_fd, 1)
            return
        try:
            if self._closed:
                return
            self._send(index, route[1], frames)
            # The send may have taken the edge that would wake the loop for a message
            # that has since arrived (the loop itself reads EVENTS before it sleeps).
            if not on_loop and (self._sockets[index].getsockopt(_EVENTS) & _POLLIN or self.wake_on_reply):
                os.eventfd_write(self._wake_fd, 1)
        finally:
            lock.release()

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
        for index, sock in enumerate(self._sockets):
            with self._locks[index]:
                fd = sock.getsockopt(zmq.FD)
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
        ready = [by_fd[fd] for fd, _ in events if fd != self._wake_fd]
        if len(ready) < len(events):
            self._drain_wake()
            ready = self._readable()
        return ready

    def _turn(self, ready: list[int], handle: Handler, tick: Callable[[], None]) -> None:
        """What the loop does when it wakes (holding the role): read the sockets in
        `ready`, send the outbox, answer the questions, then `tick`."""
        for index in ready:
            self._receive(index, handle)
        self.flush()
        while self._asks:
            question, answer = self._asks.popleft()
            try:
                answer.set_result(question())
            except Exception as exc:
                answer.set_exception(exc)
        tick()

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
        """The sockets that hold a message (by index)."""
        ready = []
        for index, sock in enumerate(self._sockets):
            with self._locks[index]:
                if sock.getsockopt(_EVENTS) & _POLLIN:
                    ready.append(index)
        return ready

    def close(self) -> None:
        if self._authenticator is not None:
            self._authenticator.stop()
        for lock in self._locks:
            lock.acquire()
        try:
            self._closed = True
            self._context.destroy(linger=0)  # every socket, even one whose bind failed
        finally:
            for lock in self._locks:
                lock.release()
        os.close(self._wake_fd)

    def _receive(self, index: int, handle: Handler) -> None:
        sock, lock = self._sockets[index], self._locks[index]
        for burst in range(RECEIVE_BURST):
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
            handle((index, frames[:cut]), [frame.buffer for frame in frames[cut:]], received_ns)

    def _send(self, index: int, envelope: list[Any], frames: list[Buffer]) -> None:
        """Send one reply (holding the socket's lock)."""
        send = self._sockets[index].send
        try:
            # Frame by frame with plain int flags: send_multipart's enum arithmetic costs
            # microseconds per reply. A gone or full peer fails on the first frame.
            for frame in envelope:
                send(frame, _MORE, copy=False)
            for frame in frames[:-1]:
                send(frame, _MORE, copy=False)
            send(frames[-1], _LAST, copy=False)
        except zmq.ZMQError as exc:
            if exc.errno not in (zmq.EHOSTUNREACH, zmq.EAGAIN):
                raise
            self._unroutable[index] += 1
