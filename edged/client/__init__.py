"""Clients for edged: `Client` (blocking) and `AsyncClient` (asyncio, many requests in flight).

Both speak through one DEALER socket per daemon and share every method
(edged.client.api); each call's copies follow edged.client.fleet's rules (retry
elsewhere, hedge). A tcp endpoint with a host name stands for every address behind it,
followed as the records change (edged.client.members). The two differ only in how they wait.

    with Client("ipc:///run/edged/edged.sock") as client:
        scores = client.infer("mlp-light", {"x": x})["scores"]
    with Client(["tcp://10.0.0.5:5555", "tcp://10.0.0.6:5555"], hedge=True) as fleet:
        scores = fleet.infer("mlp-light", {"x": x}, deadline_ms=20)["scores"]
    with Client("tcp://edged.NAMESPACE.svc:5555", curve=keys) as fleet:  # every address behind the name
        scores = fleet.infer("mlp-light", {"x": x}, deadline_ms=20)["scores"]

A daemon's CURVE tcp endpoint needs the server's public key and a client key pair
that the daemon allows: `curve=ClientKeys.from_files("server.key", "me.key_secret")`.
Like the daemon, a client uses CURVE on tcp endpoints only.
"""

from edged.client.aio import AsyncClient
from edged.client.errors import (
    ERRORS,
    DeadlineExceeded,
    EdgedError,
    Internal,
    InvalidArgument,
    NoReply,
    NotFound,
    Overloaded,
    Unavailable,
)
from edged.client.fleet import EndpointCounters
from edged.client.keys import ClientKeys
from edged.client.shm import NamedRegion, SharedRegion
from edged.client.sync import Client

__all__ = [
    "ERRORS",
    "AsyncClient",
    "Client",
    "ClientKeys",
    "DeadlineExceeded",
    "EdgedError",
    "EndpointCounters",
    "Internal",
    "InvalidArgument",
    "NamedRegion",
    "NoReply",
    "NotFound",
    "Overloaded",
    "SharedRegion",
    "Unavailable",
]
