"""Clients for edged: `Client` (blocking) and `AsyncClient` (asyncio, many requests in flight).

Both speak through one DEALER socket per daemon and share every method: `_Api` builds
each request and reads each reply once, and each call's copies follow edged.fleet's
rules (retry elsewhere, hedge); the two classes differ only in how they wait (`_call`).

    with Client("ipc:///run/edged/edged.sock") as client:
        scores = client.infer("mlp-light", {"x": x})["scores"]
    with Client(["tcp://10.0.0.5:5555", "tcp://10.0.0.6:5555"], hedge=True) as fleet:
        scores = fleet.infer("mlp-light", {"x": x}, deadline_ms=20)["scores"]

A daemon's CURVE tcp endpoint needs the server's public key and a client key pair
that the daemon allows: `curve=ClientKeys.from_files("server.key", "me.key_secret")`.
Like the daemon, a client uses CURVE on tcp endpoints only.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

# The exceptions live in edged.errors; users import them from here, beside the clients.
from edged.errors import ERRORS as ERRORS
from edged.errors import DeadlineExceeded as DeadlineExceeded
from edged.errors import EdgedError as EdgedError
from edged.errors import Internal as Internal
from edged.errors import InvalidArgument as InvalidArgument
from edged.errors import NoReply, raise_for_status
from edged.errors import NotFound as NotFound
from edged.errors import Overloaded as Overloaded
from edged.errors import Unavailable as Unavailable
from edged.fleet import Call, EndpointCounters, Fleet, SendFn
from edged.security import ClientKeys
from edged.wire.codec import Buffer, Reply, decode_reply, encode_request
from edged.wire.endpoints import is_tcp

DEFAULT_TIMEOUT_MS = 5000.0


class _Api:
    """Every operation of the protocol, written once for both clients; each call is a
    `edged.fleet.Call`, which the two classes drive over their sockets (`_call`)."""

    timeout_ms: float
    _fleet: Fleet
    _ids: Iterator[int]

    def _call(self, op: str, fields: dict[str, Any], timeout_ms: float, parse: Callable[[Reply], Any]) -> Any:
        raise NotImplementedError

    def _request(self, op: str, parse: Callable[[Reply], Any], timeout_ms: float | None = None, **fields: Any) -> Any:
        return self._call(op, fields, timeout_ms or self.timeout_ms, lambda r: parse(raise_for_status(r)))

    def _new_call(self, op: str, fields: dict[str, Any], timeout_ms: float) -> Call:
        model = fields.get("model") if op == "infer" else None
        return Call(self._fleet, model, fields.get("deadline_ms"), timeout_ms, _now_ms())

    def _frames(self, op: str, fields: dict[str, Any], deadline_ms: float | None) -> tuple[int, list[Buffer]]:
        """A copy of the request under a new id (ids are unique per client, so a late reply
        to a copy that lost is recognised), with what is left of its deadline."""
        request_id = next(self._ids)
        if deadline_ms is not None:
            fields = {**fields, "deadline_ms": deadline_ms}
        return request_id, encode_request(request_id, op, **fields)

    @staticmethod
    def _outcome(call: Call, parse: Callable[[Reply], Any]) -> Any:
        if call.reply is None:
            raise NoReply(f"no reply within {call.timeout_ms:.0f} ms")
        return parse(call.reply)

    @property
    def endpoints(self) -> list[str]:
        return list(self._fleet.endpoints)

    def counters(self) -> dict[str, EndpointCounters]:
        """Per daemon: copies sent, OK, shed, unavailable, failed, timed out, hedged,
        hedges won and late replies dropped (see edged.fleet.EndpointCounters)."""
        return {endpoint: replace(c) for endpoint, c in zip(self._fleet.endpoints, self._fleet.counters)}

    def infer(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        *,
        klass: str | None = None,
        deadline_ms: float | None = None,
        outputs: Sequence[str] | None = None,
        timeout_ms: float | None = None,
    ) -> Any:
        """Run `model`; returns {output name: array}. Raises an EdgedError unless OK.

        `klass` picks the priority class, `deadline_ms` the daemon-side budget,
        `outputs` a subset of outputs, `timeout_ms` how long this client waits.
        """
        return self._infer(lambda r: r.outputs, model, inputs, klass, deadline_ms, outputs, timeout_ms)

    def infer_reply(self, model: str, inputs: dict[str, np.ndarray], **options: Any) -> Any:
        """Like infer, with the same options, but returns the whole Reply (timing_us is in its header)."""
        return self._infer(lambda r: r, model, inputs, **options)

    def _infer(
        self,
        parse: Callable[[Reply], Any],
        model: str,
        inputs: dict[str, np.ndarray],
        klass: str | None = None,
        deadline_ms: float | None = None,
        outputs: Sequence[str] | None = None,
        timeout_ms: float | None = None,
    ) -> Any:
        if timeout_ms is None and deadline_ms is not None:
            # Past its deadline the daemon answers by itself; wait a little beyond it.
            timeout_ms = max(deadline_ms * 2, deadline_ms + 1000)
        return self._request(
            "infer",
            parse,
            timeout_ms,
            model=model,
            inputs=inputs,
            klass=klass,
            deadline_ms=deadline_ms,
            outputs=outputs,
        )

    def models(self) -> Any:
        """The served models: [{name, backend, precision, inputs, outputs}]."""
        return self._request("models", lambda r: r.header["models"])

    def health(self) -> Any:
        """{state: starting | serving | draining, uptime_s}."""
        return self._request("health", lambda r: {k: v for k, v in r.header.items() if k not in ("v", "id", "status")})

    def stats(self) -> Any:
        """Per-class counters and latency percentiles (see docs/protocol.md)."""
        return self._request("stats", lambda r: {k: v for k, v in r.header.items() if k not in ("v", "id", "status")})


class Client(_Api):
    """A blocking client: one call at a time, over one DEALER per daemon.

    `endpoints` is one endpoint or several: with several, each call goes to one daemon
    and is retried or hedged on another as edged.fleet describes (`hedge=True` sends a
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
        self._fleet = Fleet(_endpoint_list(endpoints), hedge, hedge_after_ms)
        immediate = self._fleet.several
        context = context or zmq.Context.instance()
        self._sockets = [_dealer(context, e, curve, immediate) for e in self._fleet.endpoints]
        self._poller = zmq.Poller()
        for sock in self._sockets:
            self._poller.register(sock, zmq.POLLIN)

    def _call(self, op: str, fields: dict[str, Any], timeout_ms: float, parse: Callable[[Reply], Any]) -> Any:
        call = self._new_call(op, fields, timeout_ms)

        def send(index: int, deadline_ms: float | None) -> int | None:
            request_id, frames = self._frames(op, fields, deadline_ms)
            try:
                self._sockets[index].send_multipart(frames, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None
            return request_id

        call.advance(_now_ms(), send)
        while not call.done:
            wait_ms = call.wake_at() - _now_ms()
            ready = self._poller.poll(max(math.ceil(wait_ms), 0)) if wait_ms > 0 else []
            for sock, _ in ready:
                self._read(sock, call, send)
            call.advance(_now_ms(), send)
        return self._outcome(call, parse)

    def _read(self, sock: zmq.Socket, call: Call | None, send: SendFn | None) -> None:
        """Every reply waiting on `sock`; one that is not the call's is late, and dropped."""
        counters = self._fleet.counters[self._sockets.index(sock)]
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                reply = decode_reply(frames)
            except (ValueError, KeyError, TypeError):
                continue  # not a reply of this protocol: nothing to match it to
            if call is None or send is None or not call.on_reply(reply.id, reply, _now_ms(), send):
                counters.late += 1

    def counters(self) -> dict[str, EndpointCounters]:
        for sock in self._sockets:
            self._read(sock, None, None)  # late replies already here count now, not at the next call
        return super().counters()

    def close(self) -> None:
        for sock in self._sockets:
            sock.close(linger=0)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Api):
    """An asyncio client: any number of calls in flight, replies matched by id; one
    endpoint or several, as `Client`.

    Each method returns an awaitable: `outputs = await client.infer(...)`.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        timeout_ms: float = DEFAULT_TIMEOUT_MS,
        curve: ClientKeys | None = None,
        hedge: bool = False,
        hedge_after_ms: float | None = None,
    ):
        self.timeout_ms = timeout_ms
        self._ids = itertools.count(1)
        self._fleet = Fleet(_endpoint_list(endpoints), hedge, hedge_after_ms)
        self._context = zmq.asyncio.Context()
        immediate = self._fleet.several
        self._sockets = [_dealer(self._context, e, curve, immediate) for e in self._fleet.endpoints]
        self._pending: dict[int, tuple[Call, SendFn, asyncio.Future[None]]] = {}  # by request id
        self._receivers: list[asyncio.Task[None]] = []

    async def _call(self, op: str, fields: dict[str, Any], timeout_ms: float, parse: Callable[[Reply], Any]) -> Any:
        loop = asyncio.get_running_loop()
        if not self._receivers:
            self._receivers = [loop.create_task(self._receive(i)) for i in range(len(self._sockets))]
        call = self._new_call(op, fields, timeout_ms)
        settled: asyncio.Future[None] = loop.create_future()
        ids: list[int] = []

        def send(index: int, deadline_ms: float | None) -> int | None:
            request_id, frames = self._frames(op, fields, deadline_ms)
            # A NOBLOCK send completes at once: its future is done, with Again if not taken.
            if self._sockets[index].send_multipart(frames, zmq.NOBLOCK, copy=False).exception() is not None:
                return None
            self._pending[request_id] = (call, send, settled)
            ids.append(request_id)
            return request_id

        try:
            call.advance(_now_ms(), send)
            while not call.done:
                wait_ms = call.wake_at() - _now_ms()
                if wait_ms > 0:
                    await asyncio.wait([settled], timeout=wait_ms / 1000)
                call.advance(_now_ms(), send)
        finally:
            for request_id in ids:
                self._pending.pop(request_id, None)
        return self._outcome(call, parse)

    async def _receive(self, index: int) -> None:
        sock, counters = self._sockets[index], self._fleet.counters[index]
        while True:
            frames = await sock.recv_multipart(copy=False)
            try:
                reply = decode_reply(frames)
            except (ValueError, KeyError, TypeError):
                continue  # not a reply of this protocol: nothing to match it to
            pending = self._pending.get(reply.id)
            if pending is None:
                counters.late += 1
                continue
            call, send, settled = pending
            if not call.on_reply(reply.id, reply, _now_ms(), send):
                counters.late += 1
            if call.done and not settled.done():
                settled.set_result(None)

    async def close(self) -> None:
        for receiver in self._receivers:
            receiver.cancel()
        for sock in self._sockets:
            sock.close(linger=0)
        self._context.term()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _endpoint_list(endpoints: str | Sequence[str]) -> list[str]:
    return [endpoints] if isinstance(endpoints, str) else list(endpoints)


def _dealer(context: zmq.Context, endpoint: str, curve: ClientKeys | None, immediate: bool) -> Any:
    """The one socket setup of both clients. With several daemons, ZMQ_IMMEDIATE: a
    copy is never queued for a daemon that is not connected (one killed, say); the
    send fails at once and the call picks another."""
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    if immediate:
        sock.setsockopt(zmq.IMMEDIATE, 1)
    if curve is not None and is_tcp(endpoint):
        curve.apply(sock)
    sock.connect(endpoint)
    return sock


def _now_ms() -> float:
    return time.monotonic_ns() / 1e6
