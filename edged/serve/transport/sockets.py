"""Every socket the daemon binds, grouped by the loop that will own it: a class's own
sockets (edged.wire.endpoints.class_endpoint) to that class's loop, the shared endpoints
to the default class's loop, which hands on requests for other classes (edged.serve.dispatch)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import zmq
from zmq.auth.thread import ThreadAuthenticator

from edged.config import SecurityConfig
from edged.serve.transport.binding import Bound, SocketOptions, bind
from edged.serve.transport.curve import server_keys, start_authenticator
from edged.wire.endpoints import EndpointError, class_endpoint, is_tcp

log = logging.getLogger("edged.server")


class Sockets:
    """The ZeroMQ context, the ROUTER sockets and CURVE's authenticator. Bound on the main
    thread at start-up; each socket is then its loop's alone (`by_class`)."""

    def __init__(
        self,
        endpoints: tuple[str, ...],
        max_message_bytes: int,
        classes: tuple[str, ...],
        default_class: str,
        *,
        class_sockets: bool = True,
        tcp_ports: dict[str, int] | None = None,
        ipc_mode: int = 0o660,
        ipc_group: int | None = None,
        security: SecurityConfig | None = None,
    ) -> None:
        # Refuse an unsafe or unreadable key set, or a port with nowhere to go, before anything is bound.
        curve = server_keys(endpoints, security or SecurityConfig())
        tcp_ports = tcp_ports or {}
        _check_tcp_ports(endpoints, tcp_ports)
        options = SocketOptions(max_message_bytes, ipc_mode, ipc_group, curve)
        # ZeroMQ's I/O thread 0 carries the shared endpoints, and each class's own sockets have one of
        # their own: a burst on bulk's socket, in one thread with realtime's, kept realtime's messages
        # waiting behind it (realtime's p99 36-47 ms against 6-8: docs/benchmarks.md, "I/O threads").
        self._context = zmq.Context(io_threads=1 + len(classes) if class_sockets else 1)
        self._authenticator: ThreadAuthenticator | None = None
        self.by_class: dict[str, list[Bound]] = {name: [] for name in classes}
        self._files: list[tuple[Path, int]] = []  # the ipc socket files bound, by inode: removed at close
        try:
            if curve is not None:
                # Before any bind: a CURVE socket with no ZAP handler refuses every client.
                self._authenticator = start_authenticator(self._context, curve.allowed_clients_dir)
            for io_thread, klass in enumerate(classes if class_sockets else (), start=1):
                for shared in endpoints:
                    if (own := class_endpoint(shared, klass, tcp_ports.get(klass))) is not None:
                        sock = bind(self._context, own, options, io_thread)
                        self.by_class[klass].append(Bound(sock, klass, own))
                        self._remember(own)
            for endpoint in endpoints:
                sock = bind(self._context, endpoint, options)
                self.by_class[default_class].append(Bound(sock, None, endpoint))
                self._remember(endpoint)
        except Exception:
            self.close()
            raise
        if curve is not None:
            log.info("tcp endpoints use CURVE; clients served: the keys in %s", curve.allowed_clients_dir)

    @property
    def ingress(self) -> dict[str, list[str]]:
        """By class: the endpoints of its own sockets."""
        own = {klass: [b.endpoint for b in bound if b.klass is not None] for klass, bound in self.by_class.items()}
        return {klass: endpoints for klass, endpoints in own.items() if endpoints}

    def _remember(self, endpoint: str) -> None:
        if endpoint.startswith("ipc://"):
            path = Path(endpoint[len("ipc://") :])
            self._files.append((path, path.stat().st_ino))

    def close(self) -> None:
        """End the context, once every loop has closed its sockets (closes any a failed bind
        left open), and remove the socket files: a client then finds no daemon, not a dead one's
        socket. A file another process has bound since (another inode) is left alone."""
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None
        self._context.destroy(linger=0)
        for path, inode in self._files:
            with contextlib.suppress(OSError):
                if path.lstat().st_ino == inode:
                    path.unlink()
        self._files.clear()


def _check_tcp_ports(endpoints: tuple[str, ...], tcp_ports: dict[str, int]) -> None:
    """A tcp_port needs a tcp endpoint, and not its port; checked here, once --endpoint has replaced the file's."""
    tcp = [endpoint for endpoint in endpoints if is_tcp(endpoint)]
    for klass, port in tcp_ports.items():
        key = f"classes.{klass}.tcp_port = {port}"
        if not tcp:
            raise EndpointError(f"{key} sits beside a tcp endpoint, and the daemon has none: add one or drop the key")
        if any(endpoint.rpartition(":")[2] == str(port) for endpoint in tcp):
            raise EndpointError(f"{key} is the port of a shared endpoint ({', '.join(tcp)}): choose another")
