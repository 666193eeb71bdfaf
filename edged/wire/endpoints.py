"""What an endpoint string says: tcp or not, whether a tcp one binds to loopback only,
where a class's own socket sits beside it, and where the memfd socket sits beside an ipc
one. Shared by the daemon (binding, CURVE) and the clients, which both may import it; and
the daemon's ipc socket files (its ROUTERs' and the memfd intake's), made and guarded alike."""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import socket
import stat
from pathlib import Path, PurePosixPath

LOOPBACK_NAMES = ("localhost", "lo")
# A class's name, as the config allows it: a part of its own socket file's name (class_endpoint).
CLASS_NAME = re.compile(r"[A-Za-z0-9_-]+")
# A name that is a file of its own in a folder given beside it: no path, nothing hidden
# (a model's folder in the repository, a key pair's files).
FILE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


class EndpointError(RuntimeError):
    """An endpoint that cannot be bound; the message says why."""


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
    class's tcp_port, which both sides must know), and None without one, or for a name no
    file may carry (a client's unknown class: the shared endpoint then says so)."""
    if CLASS_NAME.fullmatch(klass) is None:
        return None
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


def restrict_ipc_socket(path: Path, mode: int, group: int | None) -> None:
    """Give an ipc socket file its mode and group."""
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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EndpointError(f"cannot make the folder of ipc socket {path}: {exc.strerror}") from None
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):  # a file, a folder, a link: someone else's, never removed
        raise EndpointError(f"{path} is not a socket: choose another endpoint (edged removes only a dead socket)")
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
