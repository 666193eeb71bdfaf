"""The memfd intake: a unix socket beside each ipc endpoint (edged.wire.endpoints.
shm_socket_path) where local clients hand the daemon sealed memfds to map as regions
(docs/protocol.md, "Shared memory"). Only with `[shm] enabled = true`.

One thread owns the listening sockets and every connection (the ZeroMQ guide's rule,
kept for plain sockets): it accepts, reads each request with its descriptor
(SCM_RIGHTS), has edged.shm.registry check the seals and map the memfd, and answers
with the region's handle, which the client then names in its ZeroMQ requests. A
region belongs to the connection that registered it: when that connection closes,
its regions are forgotten (and unmapped once no request reads them).

SOCK_SEQPACKET, not a stream: each request is one message with its descriptor, each
reply one message, so a client in any language frames nothing, and a descriptor is
never split from its request.
"""

from __future__ import annotations

import itertools
import logging
import os
import selectors
import socket
import struct
import threading
import time
from pathlib import Path
from typing import cast

from edged.config import Config
from edged.shm.registry import Regions
from edged.threads import NamedThread
from edged.wire.codec import Limits, ProtocolError, Status, decode_request, encode_reply
from edged.wire.endpoints import EndpointError, prepare_ipc_path, restrict_ipc_socket, shm_socket_path

log = logging.getLogger("edged.shm")

MAX_REQUEST_BYTES = 4096  # a registration's header is some tens of bytes
LIMITS = Limits(max_header_bytes=MAX_REQUEST_BYTES)
# Connections held at once: each is a descriptor of the daemon's. Past it, a new one is
# closed at once (the regions are bounded by shm.max_regions_per_peer and shm.max_regions).
MAX_CONNECTIONS = 256
# ... and by one user (the peer's uid): one cannot take every slot from the others.
MAX_CONNECTIONS_PER_USER = MAX_CONNECTIONS // 2
ACCEPT_RETRY_S = 0.1  # after a failed accept (out of descriptors): the listener stays readable


class FdIntake:
    """The daemon's memfd sockets and the thread that alone serves them; `close` stops it."""

    def __init__(self, config: Config, regions: Regions) -> None:
        self._regions = regions
        paths = [Path(path) for e in config.endpoints if (path := shm_socket_path(e)) is not None]
        self._listeners: dict[socket.socket, Path] = {}
        self._thread: threading.Thread | None = None
        if not config.shm.enabled or not paths:
            return
        try:
            for path in paths:
                self._listeners[_listen(path, config.ipc_mode, config.ipc_group)] = path
        except BaseException:
            self._close_listeners()
            raise
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._thread = NamedThread(target=self._serve, name="shm-intake", daemon=True)
        self._thread.start()
        log.info("memfd regions: taken on %s", ", ".join(map(str, paths)))

    def close(self) -> None:
        """Stop the thread, which closes the sockets and removes their files."""
        if self._thread is None:
            return
        os.eventfd_write(self._wake_fd, 1)
        self._thread.join(timeout=5.0)
        os.close(self._wake_fd)
        self._thread = None

    def _serve(self) -> None:
        owners = itertools.count(1)  # each connection's regions are counted and forgotten together
        selector = selectors.DefaultSelector()
        selector.register(self._wake_fd, selectors.EVENT_READ)
        for listener in self._listeners:
            selector.register(listener, selectors.EVENT_READ)  # data None: a listener
        connections: dict[socket.socket, int] = {}  # by connection: the owner of its regions
        users: dict[socket.socket, int] = {}  # by connection: the peer's uid
        try:
            while True:
                for key, _ in selector.select():
                    if key.fd == self._wake_fd:
                        return
                    sock = cast(socket.socket, key.fileobj)
                    if key.data is None:
                        if (conn := _accept(sock, users)) is not None:
                            connections[conn] = next(owners)
                            selector.register(conn, selectors.EVENT_READ, connections[conn])
                        continue
                    try:
                        going_on = self._answer(sock, key.data)
                    except Exception:  # a bug here must cost this connection, never the intake
                        log.exception("failed on a memfd connection; closing it")
                        going_on = False
                    if not going_on:
                        selector.unregister(sock)
                        users.pop(sock)
                        self._drop(sock, connections.pop(sock))
        finally:
            for conn, owner in connections.items():
                self._drop(conn, owner)
            selector.close()
            self._close_listeners()

    def _answer(self, conn: socket.socket, owner: int) -> bool:
        """Answer the connection's next request; False once the connection is over."""
        try:
            data, fds, flags, _ = socket.recv_fds(conn, MAX_REQUEST_BYTES, 1, socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            return True
        except OSError:
            return False
        try:
            if not data and not fds:
                return False  # the peer closed (or sent an empty message, which ends it too)
            reply = self._register(owner, data, fds, flags)
        finally:
            for fd in fds:  # mapped by now, or refused: a mapping holds its own reference
                os.close(fd)
        try:
            conn.send(reply)
        except OSError:  # gone, or not reading its replies (its buffer is full): dropped
            return False
        return True

    def _register(self, owner: int, data: bytes, fds: list[int], flags: int) -> bytes:
        """One shm_register with its memfd: the reply's header."""
        request_id = None
        try:
            if flags & socket.MSG_TRUNC:
                raise ProtocolError(Status.INVALID_ARGUMENT, f"a request here is at most {MAX_REQUEST_BYTES} bytes")
            request = decode_request([data], LIMITS)
            request_id = request.id
            if request.op != "shm_register" or request.region is None or request.ipc_handle is not None:
                raise ProtocolError(
                    Status.INVALID_ARGUMENT,
                    "this socket takes op 'shm_register' with a memfd alone; send other ops to the ZeroMQ endpoint",
                    request_id,
                )
            if len(fds) != 1 or flags & socket.MSG_CTRUNC:
                more = " and more, which the daemon closed" if flags & socket.MSG_CTRUNC else ""
                raise ProtocolError(
                    Status.INVALID_ARGUMENT,
                    f"send one descriptor, the memfd, with each shm_register (SCM_RIGHTS); got {len(fds)}{more}",
                    request_id,
                )
            region = request.region
            handle = self._regions.register_fd(owner, fds[0], region.nbytes, region.region, request_id)
            return bytes(encode_reply(request_id, Status.OK, region=handle, bytes=region.nbytes)[0])
        except ProtocolError as exc:
            return bytes(encode_reply(exc.request_id, exc.status, error=exc.message)[0])
        except Exception as exc:  # a bug here must cost this request, not the connection and its regions
            log.exception("failed on a memfd registration")
            error = f"the daemon failed on this request: {exc}"
            return bytes(encode_reply(request_id, Status.INTERNAL, error=error)[0])

    def _drop(self, conn: socket.socket, owner: int) -> None:
        """A connection is over: its regions go with it."""
        conn.close()
        self._regions.forget(owner)

    def _close_listeners(self) -> None:
        for listener, path in self._listeners.items():
            listener.close()
            path.unlink(missing_ok=True)


def _accept(listener: socket.socket, users: dict[socket.socket, int]) -> socket.socket | None:
    """The next connection, added to `users` (those held, with their peers' uids), unless
    MAX_CONNECTIONS are held, or MAX_CONNECTIONS_PER_USER of its user's: then it is closed at once."""
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return None
    except OSError as exc:
        log.warning("cannot accept a memfd connection: %s", exc)
        time.sleep(ACCEPT_RETRY_S)
        return None
    # struct ucred: pid, uid, gid.
    _, uid, _ = struct.unpack("iII", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII")))
    if len(users) >= MAX_CONNECTIONS or sum(user == uid for user in users.values()) >= MAX_CONNECTIONS_PER_USER:
        conn.close()
        return None
    conn.setblocking(False)
    users[conn] = uid
    return conn


def _listen(path: Path, mode: int, group: int | None) -> socket.socket:
    """A SOCK_SEQPACKET unix socket bound at `path` with the ipc sockets' mode and group.
    Raises EndpointError, saying why, when it cannot."""
    prepare_ipc_path(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        # As for the ipc sockets: no more open than `mode` from its first moment, then exact.
        old_umask = os.umask(0o777 & ~mode)
        try:
            listener.bind(str(path))
        except OSError as exc:
            raise EndpointError(f"cannot bind the memfd socket {path}: {exc}") from None
        finally:
            os.umask(old_umask)
        restrict_ipc_socket(path, mode, group)
        listener.listen(64)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        raise
    return listener
