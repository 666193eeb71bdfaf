"""The asyncio client."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import zmq
import zmq.asyncio

from edged.client.api import DEFAULT_RESOLVE_EVERY_S, DEFAULT_TIMEOUT_MS, Api, now_ms
from edged.client.call import Call, SendFn
from edged.client.keys import ClientKeys
from edged.client.members import Resolve
from edged.client.shm import SharedRegion
from edged.wire.codec import Reply, decode_reply
from edged.wire.messages import MAX_MESSAGE_BYTES


class AsyncClient(Api):
    """An asyncio client: any number of calls in flight, replies matched by id; one
    endpoint, several, or a name that stands for several, and a class's own sockets, as `Client`.

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
        resolve_every_s: float = DEFAULT_RESOLVE_EVERY_S,
        resolve: Resolve | None = None,
        class_ports: Mapping[str, int] | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ):
        self.timeout_ms = timeout_ms
        self.max_message_bytes = max_message_bytes
        self._ids = itertools.count(1)
        self._context = zmq.asyncio.Context()
        self._curve = curve
        self._class_ports = None if class_ports is None else dict(class_ports)
        self._regions, self._made = [], []
        self._fd_channel = None
        self._letting_go: set[asyncio.Future[None]] = set()  # cancelled registrations' undoing (_registering)
        self._pending: dict[int, tuple[Call, SendFn, asyncio.Future[None]]] = {}  # by request id
        # Each socket's reading task, from the first call on (the loop runs only then), on that call's loop.
        self._receivers: dict[zmq.asyncio.Socket, asyncio.Task[None]] | None = None
        self._receivers_loop: asyncio.AbstractEventLoop | None = None
        self._start(endpoints, hedge, hedge_after_ms, resolve_every_s, resolve)

    def _watch(self, sock: zmq.asyncio.Socket, index: int) -> None:
        self._daemon_of[sock] = index
        if self._receivers is not None:
            self._receivers[sock] = asyncio.get_running_loop().create_task(self._receive(sock, index))

    def _unwatch(self, sock: zmq.asyncio.Socket) -> None:
        del self._daemon_of[sock]
        if self._receivers is not None:
            self._receivers.pop(sock).cancel()

    def _try_send(self, sock: zmq.asyncio.Socket, frames: list[Any]) -> bool:
        # A NOBLOCK send completes at once: its future is done, with Again if not taken.
        sent = sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
        return sent.exception() is None  # type: ignore[attr-defined]  # typed an Awaitable; it is a Future

    async def _call(self, op: str, fields: dict[str, Any], timeout_ms: float, parse: Callable[[Reply], Any]) -> Any:
        loop = asyncio.get_running_loop()
        call = self._new_call(op, fields, timeout_ms)
        # The first call, or the first on another loop: asyncio.run cancels every task of its loop at its end.
        if self._receivers_loop is not loop:
            self._receivers_loop = loop
            self._receivers = {s: loop.create_task(self._receive(s, i)) for s, i in self._daemon_of.items()}
        self._follow()
        settled: asyncio.Future[None] = loop.create_future()
        ids: list[int] = []

        def send(index: int, deadline_ms: float | None) -> int | None:
            request_id, frames = self._frames(op, fields, deadline_ms)
            for sock in self._sockets_for(index, fields.get("klass")):
                if self._try_send(sock, frames):
                    self._pending[request_id] = (call, send, settled)
                    ids.append(request_id)
                    return request_id
            return None

        try:
            call.advance(now_ms(), send)
            while not call.done:
                wait_ms = call.wake_at() - now_ms()
                if wait_ms > 0:
                    await asyncio.wait([settled], timeout=wait_ms / 1000)
                if call.done:  # a reply, or the client closed meanwhile
                    break
                self._follow()
                call.advance(now_ms(), send)
        finally:
            for request_id in ids:
                self._pending.pop(request_id, None)
            call.abandon()  # a cancelled call's copies count in flight no more
        return self._outcome(call, parse)

    def _register(self, region: Any, fields: dict[str, Any] | None, owned: bool = False) -> Any:
        return self._registering(super()._register(region, fields, owned), owned)

    async def _registering(self, registration: Awaitable[Any], owned: bool) -> Any:
        """`registration`, carried on if the caller is cancelled (`asyncio.wait_for`, say): a region
        the daemon registers meanwhile is then let go, not held against this peer's limit till close."""
        exchange = asyncio.ensure_future(registration)
        try:
            return await asyncio.shield(exchange)
        except asyncio.CancelledError:
            undo = asyncio.ensure_future(self._let_go(exchange, owned))
            self._letting_go.add(undo)
            undo.add_done_callback(self._letting_go.discard)
            raise

    async def _let_go(self, exchange: asyncio.Future[Any], owned: bool) -> None:
        try:
            region = await exchange
        except Exception:
            return  # refused, or no reply: nothing registered here (an owned region was closed on the way)
        try:
            await self.unregister(region)
        except Exception:  # the daemon lets it go itself once this client closes, or after shm.idle_s
            pass
        finally:
            if owned:  # made for the call alone, which never returned it
                region.close()

    async def _call_fd(self, region: SharedRegion, owned: bool, parse: Callable[[Reply], Any]) -> Any:
        # On a thread: the exchange blocks, if only for the daemon's answer, and the loop must not.
        return parse(await asyncio.to_thread(self._register_fd, region, owned))

    async def _receive(self, sock: zmq.asyncio.Socket, index: int) -> None:
        counters = self._fleet.counters[index]
        while True:
            frames = await sock.recv_multipart(copy=False)
            try:
                reply = decode_reply(frames)
            except (ValueError, KeyError, TypeError):
                continue  # not a reply of this protocol: nothing to match it to
            if self._learn(reply):
                continue
            request_id = self._fleet.owner(reply.id, index, now_ms(), lambda: self._copies_on(index))
            pending = self._pending.get(request_id)
            if pending is None:
                counters.late += 1
                continue
            call, send, settled = pending
            if not call.on_reply(request_id, reply, now_ms(), send):
                counters.late += 1
            if call.done and not settled.done():
                settled.set_result(None)

    def _copies_on(self, index: int) -> list[int]:
        """The ids of the copies the calls await from daemon `index` (Call.copies_on)."""
        calls = {id(call): call for call, _, _ in self._pending.values()}.values()  # a call per copy, once
        return [request_id for call in calls for request_id in call.copies_on(index)]

    async def close(self) -> None:
        """Close the sockets; a call still waiting raises RuntimeError at once."""
        for call, _, settled in self._pending.values():
            call.abandon()
            if not settled.done():
                settled.set_result(None)
        for receiver in (self._receivers or {}).values():
            receiver.cancel()
        self._close_sockets()
        self._close_shared()
        self._context.term()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
