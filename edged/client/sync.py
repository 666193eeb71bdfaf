"""The blocking client."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from edged.client.api import DEFAULT_TIMEOUT_MS, Api, dealer, endpoint_list, now_ms
from edged.client.call import Call, SendFn
from edged.client.fleet import EndpointCounters, Fleet
from edged.client.keys import ClientKeys
from edged.client.shm import SharedRegion
from edged.wire.codec import Reply, decode_reply


class Client(Api):
    """A blocking client: one call at a time, over one DEALER per daemon.

    `endpoints` is one endpoint or several: with several, each call goes to one daemon
    and is retried or hedged on another as edged.client.fleet describes (`hedge=True` sends a
    copy after this client's p95 for the model, or after `hedge_after_ms`).
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
    ):
        self.timeout_ms = timeout_ms
        self._ids = itertools.count(1)
        self._fleet = Fleet(endpoint_list(endpoints), hedge, hedge_after_ms)
        immediate = self._fleet.several
        context = context or zmq.Context.instance()
        self._context = context
        self._sockets = [dealer(context, e, curve, immediate) for e in self._fleet.endpoints]
        self._class_sockets = {}
        self._regions = []
        self._fd_channel = None
        self._daemon_of: dict[zmq.Socket, int] = {}  # every socket: the daemon it reaches, by index
        self._poller = zmq.Poller()
        for index, sock in enumerate(self._sockets):
            self._watch(sock, index)

    def _watch(self, sock: zmq.Socket, index: int) -> None:
        self._daemon_of[sock] = index
        self._poller.register(sock, zmq.POLLIN)

    def _connect(self, index: int, endpoint: str) -> zmq.Socket:
        sock = dealer(self._context, endpoint, None, immediate=True)
        self._watch(sock, index)
        return sock

    def _call(self, op: str, fields: dict[str, Any], timeout_ms: float, parse: Callable[[Reply], Any]) -> Any:
        call = self._new_call(op, fields, timeout_ms)

        def send(index: int, deadline_ms: float | None) -> int | None:
            request_id, frames = self._frames(op, fields, deadline_ms)
            for sock in self._sockets_for(index, fields.get("klass")):
                try:
                    sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    continue
                return request_id
            return None

        call.advance(now_ms(), send)
        while not call.done:
            wait_ms = call.wake_at() - now_ms()
            ready = self._poller.poll(max(math.ceil(wait_ms), 0)) if wait_ms > 0 else []
            for sock, _ in ready:
                self._read(sock, call, send)
            call.advance(now_ms(), send)
        return self._outcome(call, parse)

    def _call_fd(self, region: SharedRegion, owned: bool, parse: Callable[[Reply], Any]) -> Any:
        return parse(self._register_fd(region, owned))

    def _read(self, sock: zmq.Socket, call: Call | None, send: SendFn | None) -> None:
        """Every reply waiting on `sock`; one that is not the call's is late, and dropped."""
        counters = self._fleet.counters[self._daemon_of[sock]]
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                reply = decode_reply(frames)
            except (ValueError, KeyError, TypeError):
                continue  # not a reply of this protocol: nothing to match it to
            if call is None or send is None or not call.on_reply(reply.id, reply, now_ms(), send):
                counters.late += 1

    def counters(self) -> dict[str, EndpointCounters]:
        for sock in self._daemon_of:
            self._read(sock, None, None)  # late replies already here count now, not at the next call
        return super().counters()

    def close(self) -> None:
        for sock in self._daemon_of:
            sock.close(linger=0)
        if self._fd_channel is not None:
            self._fd_channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
