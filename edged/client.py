"""Clients for edged: `Client` (blocking) and `AsyncClient` (asyncio, many requests in flight).

Both speak through a DEALER socket and share every method: `_Api` builds each
request and reads each reply once; the two classes differ only in how one
round trip is carried (`_call`).

    with Client("ipc:///run/edged/edged.sock") as client:
        scores = client.infer("mlp-light", {"x": x})["scores"]

A daemon's CURVE tcp endpoint needs the server's public key and a client key pair
that the daemon allows: `curve=ClientKeys.from_files("server.key", "me.key_secret")`.
Like the daemon, a client uses CURVE on tcp endpoints only.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from edged.security import ClientKeys, is_tcp
from edged.wire.codec import Buffer, Reply, Status, decode_reply, encode_request

DEFAULT_TIMEOUT_MS = 5000.0


class EdgedError(Exception):
    """A request that did not succeed; `status` is the daemon's, `message` its sentence."""

    status: Status | None = None

    def __init__(self, message: str, reply: Reply | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reply = reply


class InvalidArgument(EdgedError):
    status = Status.INVALID_ARGUMENT


class NotFound(EdgedError):
    status = Status.NOT_FOUND


class Overloaded(EdgedError):
    status = Status.OVERLOADED

    @property
    def retry_after_ms(self) -> float:
        return float(self.reply.header.get("retry_after_ms", 0.0)) if self.reply else 0.0


class DeadlineExceeded(EdgedError):
    status = Status.DEADLINE_EXCEEDED


class Unavailable(EdgedError):
    status = Status.UNAVAILABLE


class Internal(EdgedError):
    status = Status.INTERNAL


class NoReply(EdgedError):
    """No reply came within the client's timeout (the daemon may be gone or stuck)."""


ERRORS: dict[Status, type[EdgedError]] = {
    cls.status: cls for cls in (InvalidArgument, NotFound, Overloaded, DeadlineExceeded, Unavailable, Internal)
}


def raise_for_status(reply: Reply) -> Reply:
    """The reply itself when OK; else the exception of its status."""
    if reply.status is not Status.OK:
        raise ERRORS[reply.status](f"{reply.status.value}: {reply.error}", reply)
    return reply


class _Api:
    """Every operation of the protocol, written once for both clients."""

    timeout_ms: float

    def _call(self, frames: list[Buffer], request_id: int, timeout_ms: float, parse: Callable[[Reply], Any]) -> Any:
        raise NotImplementedError

    def _request(self, op: str, parse: Callable[[Reply], Any], timeout_ms: float | None = None, **fields: Any) -> Any:
        request_id = next(self._ids)
        frames = encode_request(request_id, op, **fields)
        return self._call(frames, request_id, timeout_ms or self.timeout_ms, lambda r: parse(raise_for_status(r)))

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
    """A blocking client: one request at a time on a DEALER socket."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_ms: float = DEFAULT_TIMEOUT_MS,
        context: zmq.Context | None = None,
        curve: ClientKeys | None = None,
    ):
        self.timeout_ms = timeout_ms
        self._ids = itertools.count(1)
        self._socket = _dealer(context or zmq.Context.instance(), endpoint, curve)

    def _call(self, frames: list[Buffer], request_id: int, timeout_ms: float, parse: Callable[[Reply], Any]) -> Any:
        self._socket.send_multipart(frames, copy=False)
        deadline = _now_ms() + timeout_ms
        while (left := deadline - _now_ms()) > 0:
            if not self._socket.poll(left):
                break
            reply = decode_reply(self._socket.recv_multipart(copy=False))
            if reply.id == request_id:  # a late reply to an earlier, timed-out request is dropped
                return parse(reply)
        raise NoReply(f"no reply within {timeout_ms:.0f} ms")

    def close(self) -> None:
        self._socket.close(linger=0)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Api):
    """An asyncio client: any number of requests in flight, replies matched by id.

    Each method returns an awaitable: `outputs = await client.infer(...)`.
    """

    def __init__(self, endpoint: str, *, timeout_ms: float = DEFAULT_TIMEOUT_MS, curve: ClientKeys | None = None):
        self.timeout_ms = timeout_ms
        self._ids = itertools.count(1)
        self._context = zmq.asyncio.Context()
        self._socket = _dealer(self._context, endpoint, curve)
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._receiver: asyncio.Task[None] | None = None

    async def _call(
        self, frames: list[Buffer], request_id: int, timeout_ms: float, parse: Callable[[Reply], Any]
    ) -> Any:
        if self._receiver is None:
            self._receiver = asyncio.get_running_loop().create_task(self._receive())
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await self._socket.send_multipart(frames, copy=False)
            reply = await asyncio.wait_for(future, timeout_ms / 1000)
        except TimeoutError:
            raise NoReply(f"no reply within {timeout_ms:.0f} ms") from None
        finally:
            self._pending.pop(request_id, None)
        return parse(reply)

    async def _receive(self) -> None:
        while True:
            frames = await self._socket.recv_multipart(copy=False)
            try:
                reply = decode_reply(frames)
            except (ValueError, KeyError, TypeError):
                continue  # not a reply of this protocol: nothing to match it to
            future = self._pending.get(reply.id)
            if future is not None and not future.done():
                future.set_result(reply)

    async def close(self) -> None:
        if self._receiver is not None:
            self._receiver.cancel()
        self._socket.close(linger=0)
        self._context.term()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _dealer(context: zmq.Context, endpoint: str, curve: ClientKeys | None) -> Any:
    """The one socket setup of both clients."""
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    if curve is not None and is_tcp(endpoint):
        curve.apply(sock)
    sock.connect(endpoint)
    return sock


def _now_ms() -> float:
    return time.monotonic_ns() / 1e6
