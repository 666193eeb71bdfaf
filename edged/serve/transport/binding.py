"""Binding the daemon's ROUTER sockets, and `Bound`: what a loop keeps of each one, and how it reads and sends there."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from edged.serve.transport.curve import ServerKeys, make_curve_server
from edged.wire.endpoints import EndpointError, is_tcp, prepare_ipc_path, restrict_ipc_socket

# zmq's flags and options as plain ints: its enum members make every `|` and `&` a Python call.
_MORE, _LAST = int(zmq.SNDMORE | zmq.NOBLOCK), int(zmq.NOBLOCK)
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


@dataclass(slots=True)
class Bound:
    """One bound ROUTER; used by its loop's thread alone."""

    sock: zmq.Socket
    klass: str | None  # the class it takes alone; None: any (a shared endpoint)
    endpoint: str
    unroutable: int = 0
    # By descriptor, what to call, by connection, once it closes (edged.serve.transport.when_closed).
    closing: dict[int, dict[bytes, Callable[[bytes], None]]] = field(default_factory=dict)
    # Before a routing id in a peer's key (edged.serve.transport.peer): a ROUTER keeps ids unique on itself alone.
    peer_prefix: bytes = field(init=False)
    # Where the socket's connections' ends are told (`watch_closing`): an ipc socket's alone, since shared
    # memory, the state a connection leaves behind, is registered over ipc alone.
    monitor: zmq.Socket | None = field(init=False)

    def __post_init__(self) -> None:
        self.peer_prefix = f"{self.endpoint}\0".encode()
        self.monitor = watch_closing(self.sock) if self.local else None

    @property
    def local(self) -> bool:
        """An ipc endpoint: its clients are on this machine."""
        return self.endpoint.startswith("ipc://")

    def waiting(self) -> bool:
        """Whether a message waits: a third of the cost of a receive that finds none (its exception)."""
        return bool(self.sock.getsockopt(_EVENTS) & _POLLIN)  # type: ignore[operator]  # an int for ZMQ_EVENTS

    def read(self) -> tuple[list[zmq.Frame], int] | None:
        """The next message's frames and when it was read, without blocking; None when none waits."""
        recv = self.sock.recv
        try:
            frames = [recv(_LAST, copy=False)]
        except zmq.Again:
            return None
        while frames[-1].more:  # a message's parts arrive together
            frames.append(recv(_LAST, copy=False))
        return frames, time.monotonic_ns()

    def send(self, envelope: list[Any], frames: list[Any]) -> bool:
        """Send one reply; one whose peer is gone or full is counted, not raised (False)."""
        send = self.sock.send
        try:
            # Not send_multipart (its enum arithmetic costs microseconds); a gone or full peer fails at frame 1.
            for frame in envelope:
                send(frame, _MORE, copy=False)
            for frame in frames[:-1]:
                send(frame, _MORE, copy=False)
            send(frames[-1], _LAST, copy=False)
        except zmq.ZMQError as exc:
            if exc.errno not in (zmq.EHOSTUNREACH, zmq.EAGAIN):
                raise
            self.unroutable += 1
            return False
        return True


@dataclass(frozen=True, slots=True)
class SocketOptions:
    max_message_bytes: int
    ipc_mode: int
    ipc_group: int | None  # None: the process's group
    curve: ServerKeys | None  # for tcp endpoints; None: plain


def bind(context: zmq.Context, endpoint: str, options: SocketOptions, io_thread: int = 0) -> zmq.Socket:
    """A ROUTER bound on `endpoint`, served by ZeroMQ's I/O thread `io_thread`; raises
    EndpointError saying why not. Called on the main thread before the owning loop starts
    (a thread's start is the memory barrier a socket needs to change threads)."""
    ipc_path = Path(endpoint[len("ipc://") :]) if endpoint.startswith("ipc://") else None
    if ipc_path is not None:
        prepare_ipc_path(ipc_path)
    sock = context.socket(zmq.ROUTER)
    sock.linger = 0
    # Else a reply to a gone or full peer is dropped in silence, and cannot be counted.
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.MAXMSGSIZE, options.max_message_bytes)
    sock.setsockopt(zmq.AFFINITY, 1 << io_thread)
    if options.curve is not None and is_tcp(endpoint):
        make_curve_server(sock, options.curve)
    # libzmq creates the file inside bind: the umask keeps it from being more open than ipc_mode.
    old_umask = os.umask(0o777 & ~options.ipc_mode) if ipc_path is not None else None
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        sock.close()
        raise EndpointError(f"cannot bind {endpoint}: {exc}") from None
    finally:
        if old_umask is not None:
            os.umask(old_umask)
    if ipc_path is not None:
        restrict_ipc_socket(ipc_path, options.ipc_mode, options.ipc_group)
    return sock


def watch_closing(sock: zmq.Socket) -> zmq.Socket:
    """A socket that tells each end of `sock`'s connections (ZeroMQ's monitor; made on the main
    thread, as `bind` is, before the owning loop starts)."""
    address = f"inproc://edged-closing-{id(sock)}"
    sock.monitor(address, zmq.EVENT_DISCONNECTED)
    reader = sock.context.socket(zmq.PAIR)
    # Unbounded: libzmq's I/O thread blocks on a full monitor pipe, and with it every socket it
    # serves (realtime's among them), while this socket's loop runs a call and reads nothing.
    reader.rcvhwm = 0
    reader.connect(address)
    return reader
