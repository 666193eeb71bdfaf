"""What an endpoint string says: tcp or not, whether a tcp one binds to loopback only,
where a class's own socket sits beside it, and where the memfd socket sits beside an ipc
one. Shared by the daemon (binding, CURVE) and the clients, which both may import it."""

from __future__ import annotations

import ipaddress
from pathlib import PurePosixPath

LOOPBACK_NAMES = ("localhost", "lo")


def is_tcp(endpoint: str) -> bool:
    return endpoint.startswith("tcp://")


def is_loopback(endpoint: str) -> bool:
    """Whether a tcp endpoint binds to loopback only; anything unclear (a host name, *, an interface) is not."""
    host = endpoint[len("tcp://") :].rpartition(":")[0].strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def class_endpoint(endpoint: str, klass: str, tcp_port: int | None = None) -> str | None:
    """Where the socket of `klass` alone sits beside the shared `endpoint`: ipc://DIR/NAME.sock
    gives ipc://DIR/NAME-KLASS.sock; tcp://HOST:PORT gives tcp://HOST:`tcp_port` (the
    class's tcp_port, which both sides must know), and None without one."""
    if is_tcp(endpoint):
        return None if tcp_port is None else f"{endpoint.rpartition(':')[0]}:{tcp_port}"
    path = PurePosixPath(endpoint[len("ipc://") :])
    return f"ipc://{path.with_name(f'{path.stem}-{klass}{path.suffix}')}"


def tcp_class_ports(ingress: dict[str, list[str]]) -> dict[str, int]:
    """Each class's tcp_port, read from health's `ingress`: what a client given only the
    shared endpoint passes as `class_ports` (every tcp socket of a class has its one port)."""
    return {klass: int(e.rpartition(":")[2]) for klass, endpoints in ingress.items() for e in endpoints if is_tcp(e)}


def shm_socket_path(endpoint: str) -> str | None:
    """Where the daemon takes sealed memfds beside the ipc `endpoint` (docs/protocol.md,
    "Shared memory"): ipc://DIR/NAME.sock gives DIR/NAME.shm.sock. None for tcp. Not
    NAME-shm.sock: that is where a class named "shm" has its own socket."""
    if not endpoint.startswith("ipc://"):
        return None
    path = PurePosixPath(endpoint[len("ipc://") :])
    return str(path.with_name(f"{path.stem}.shm.sock"))
