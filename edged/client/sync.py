"""The blocking client."""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import zmq

from edged.client.api import DEFAULT_RESOLVE_EVERY_S, DEFAULT_TIMEOUT_MS, Api, now_ms
from edged.client.call import Call, SendFn
from edged.client.fleet import EndpointCounters
from edged.client.keys import ClientKeys
from edged.client.members import Resolve
from edged.client.shm import SharedRegion
from edged.wire.codec import Reply, decode_reply
from edged.wire.messages import MAX_MESSAGE_BYTES

# The longest single wait handed to zmq_poll (its timeout is a C long of ms): a longer one is waited in turns.
POLL_MOST_MS = 3_600_000


class Client(Api):
    """A blocking client: one call at a time, over one DEALER per daemon.

    `endpoints` is one endpoint or several: with several, each call goes to one daemon
    and is retried or hedged on another as edged.client.fleet describes (`hedge=True` sends a
    copy after this client's p95 for the model, or after `hedge_after_ms`).

    One tcp endpoint with a host name, `tcp://edged.NAMESPACE.svc:5555`, is the fleet of
    every address behind the name, looked up again every `resolve_every_s` and at once
    when no daemon takes a call (edged.client.members). `resolve(host, port)` replaces the
    system resolver: a list of addresses, or an exception (which keeps the last answer).

    A call that names a class goes to that class's own socket where the daemon has one,
    else to the shared endpoint (docs/protocol.md, "A socket per class"): beside an ipc
    endpoint at its fixed place; beside a tcp endpoint on the class's port (the daemon's
    `[classes.NAME] tcp_port`), read from each daemon's health at the first call naming a
    class there, or given for every daemon in `class_ports` (then nothing is asked).

    An input over `max_message_bytes` (the daemon's server.max_message_bytes) is refused here,
    before it is sent: ZeroMQ would drop the connection, and with it every call in flight.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        timeout_ms: float = DEFAULT_TIMEOUT_MS,
        context: zmq.Context | None = None,
        curve: ClientKeys | None = None,
        hedge: bool = False,
        hedge_after_ms: float | None = None,
        resolve_every_s: float = DEFAULT_RESOLVE_EVERY_S,
        resolve: Resolve | None = None,
        class_ports: Mapping[str, int] | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ):
        self.timeout_ms = timeout_ms
        self.max_message_bytes = max_message_bytes
        self._ids = itertools.count(1)
        self._context = context or zmq.Context.instance()
        self._curve = curve
        self._class_ports = None if class_ports is None else dict(class_ports)
        self._regions, self._made = [], []
        self._fd_channel = None
        self._poller = zmq.Poller()
        self._calling = threading.RLock()  # held through a call (re-entered where a call asks health)
        self._start(endpoints, hedge, hedge_after_ms, resolve_every_s, resolve)

    def _watch(self, sock: zmq.Socket, index: int) -> None:
        self._daemon_of[sock] = index
        self._poller.register(sock, zmq.POLLIN)

    def _unwatch(self, sock: zmq.Socket) -> None:
        del self._daemon_of[sock]
        self._poller.unregister(sock)

    def _try_send(self, sock: zmq.Socket, frames: list[Any]) -> bool:
        try:
            sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        return True

    def _call(self, op: str, fields: dict[str, Any], timeout_ms: float, parse: Callable[[Reply], Any]) -> Any:
        # Its sockets and calls are one thread's at a time: two threads reading them took each other's replies.
        if not self._calling.acquire(blocking=False):
            raise RuntimeError(
                "this Client is in a call on another thread: a Client makes one call at a time; "
                "give each thread its own Client, or use AsyncClient for calls in flight together"
            )
        try:
            return self._one_call(op, fields, timeout_ms, parse)
        finally:
            self._calling.release()

    def _one_call(self, op: str, fields: dict[str, Any], timeout_ms: float, parse: Callable[[Reply], Any]) -> Any:
        call = self._new_call(op, fields, timeout_ms)

        def send(index: int, deadline_ms: float | None) -> int | None:
            request_id, frames = self._frames(op, fields, deadline_ms)
            for sock in self._sockets_for(index, fields.get("klass")):
                if self._try_send(sock, frames):
                    return request_id
            return None

        self._follow()
        call.advance(now_ms(), send)
        while not call.done:
            wait_ms = call.wake_at() - now_ms()
            if wait_ms <= 0:
                ready = []
            else:  # an endless wait (timeout_ms = inf) without a limit; a long one in turns zmq_poll can take
                ready = self._poller.poll(None if wait_ms == math.inf else min(math.ceil(wait_ms), POLL_MOST_MS))
            for sock, _ in ready:
                self._read(sock, call, send)
            self._follow()
            call.advance(now_ms(), send)
        self._follow()  # a leaving daemon's last copy may have settled with this call
        return self._outcome(call, parse)

    def _call_fd(self, region: SharedRegion, owned: bool, parse: Callable[[Reply], Any]) -> Any:
        return parse(self._register_fd(region, owned))

    def _read(self, sock: zmq.Socket, call: Call | None, send: SendFn | None) -> None:
        """Every reply waiting on `sock`; one that is not the call's is late, and dropped."""
        index = self._daemon_of[sock]
        counters = self._fleet.counters[index]
        awaited = (lambda: call.copies_on(index)) if call is not None else list
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                reply = decode_reply(frames)
            except (ValueError, KeyError, TypeError):
                continue  # not a reply of this protocol: nothing to match it to
            if self._learn(reply):
                continue
            request_id = self._fleet.owner(reply.id, index, now_ms(), awaited)
            if call is None or send is None or not call.on_reply(request_id, reply, now_ms(), send):
                counters.late += 1

    def counters(self) -> dict[str, EndpointCounters]:
        # Late replies already here count now, not at the next call; not while a call on another thread reads.
        if self._calling.acquire(blocking=False):
            try:
                for sock in self._daemon_of:
                    self._read(sock, None, None)
            finally:
                self._calling.release()
        return super().counters()

    def close(self) -> None:
        self._close_sockets()
        self._close_shared()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
