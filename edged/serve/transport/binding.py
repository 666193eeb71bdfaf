"""The daemon's ROUTER sockets: binding them (options, ipc socket files, and the errors
that name what stops a bind), and what a loop keeps of each bound one, its reply's
send included (edged.serve.transport.loop reads and writes them)."""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from edged.serve.transport.curve import ServerKeys, make_curve_server
from edged.wire.endpoints import is_tcp

# zmq's flags as plain ints: its enum members make every `|` a Python call.
_MORE, _LAST = int(zmq.SNDMORE | zmq.NOBLOCK), int(zmq.NOBLOCK)


class EndpointError(RuntimeError):
    """An endpoint that cannot be bound; the message says why."""


@dataclass(slots=True)
class Bound:
    """One bound ROUTER and what its loop keeps of it; used by that loop's thread alone."""

    sock: zmq.Socket
    klass: str | None  # the class it takes alone; None: any (a shared endpoint)
    endpoint: str
    unroutable: int = 0  # replies whose peer was gone or not reading

    @property
    def local(self) -> bool:
        """Whether it is an ipc endpoint's: its clients are on this machine."""
        return self.endpoint.startswith("ipc://")

    def send(self, envelope: list[Any], frames: list[Any]) -> None:
        """Send one reply; one whose peer is gone or full is counted."""
        send = self.sock.send
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
            self.unroutable += 1


@dataclass(frozen=True, slots=True)
class SocketOptions:
    max_message_bytes: int
    ipc_mode: int
    ipc_group: int | None  # None: the process's group
    curve: ServerKeys | None  # for tcp endpoints; None: plain


def bind(context: zmq.Context, endpoint: str, options: SocketOptions, io_thread: int = 0) -> zmq.Socket:
    """A ROUTER bound on `endpoint`, with the daemon's options, its connections served by
    ZeroMQ's I/O thread number `io_thread`; an ipc socket file gets `ipc_mode` and
    `ipc_group`. Raises EndpointError, saying why, when it cannot. Bound on the daemon's
    main thread, before the loop that owns it starts (a thread's start is the full
    memory barrier a socket needs to change threads); only that loop uses it after."""
    ipc_path = Path(endpoint[len("ipc://") :]) if endpoint.startswith("ipc://") else None
    if ipc_path is not None:
        prepare_ipc_path(ipc_path)
    sock = context.socket(zmq.ROUTER)
    sock.linger = 0
    # Without it a ROUTER drops a reply to a gone or full peer in silence; with
    # it the send fails, and the one-reply promise can count what was lost.
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.MAXMSGSIZE, options.max_message_bytes)
    sock.setsockopt(zmq.AFFINITY, 1 << io_thread)
    if options.curve is not None and is_tcp(endpoint):
        make_curve_server(sock, options.curve)
    # The umask makes the socket file no more open than ipc_mode from its first
    # moment (libzmq creates it inside bind, on this thread); chmod makes it exact.
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


def restrict_ipc_socket(path: Path, mode: int, group: int | None) -> None:
    """Give an ipc socket file (the memfd socket's too: edged.shm.intake) its mode and group."""
    try:
        os.chmod(path, mode)
        if group is not None:
            os.chown(path, -1, group)
    except OSError as exc:
        raise EndpointError(
            f"cannot set mode {mode:o} and group {group} on ipc socket {path}: {exc}; "
            "check server.ipc_mode and server.ipc_group (the daemon must belong to the group it gives the socket)"
        ) from None


def prepare_ipc_path(path: Path) -> None:
    """Create the socket's folder, and refuse to steal a socket another daemon serves."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise EndpointError(f"cannot check existing ipc socket {path}: {exc}") from None
        path.unlink(missing_ok=True)  # left by a daemon that died: take its place
        return
    finally:
        probe.close()
    raise EndpointError(f"ipc socket {path} is in use by another process: stop it or choose another endpoint")
