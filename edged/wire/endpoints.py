"""What an endpoint string says: tcp or not, and whether a tcp one binds to loopback
only. Shared by the daemon (binding, CURVE) and the clients, which both may import it."""

from __future__ import annotations

import ipaddress

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
