"""A stand-in for the loop that owns a socket, for lanes and dispatchers driven
in-process: each reply sent through it is kept, labelled by the route it answers."""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any

from edged.serve.transport import Route
from edged.wire.codec import Buffer


@dataclass(frozen=True)
class _Socket:
    local: bool = True
    klass: str | None = None
    peer_prefix: bytes = b"in-process\0"


@dataclass(frozen=True)
class _Peer:
    bytes: bytes


class Replies:
    """Where the replies to routes made by `route` go: `queue` holds (label, frames)."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[Any, list[Buffer]]] = queue.Queue()
        self.bound = [_Socket()]

    def route(self, label: Any, peer: bytes = b"peer") -> Route:
        """A route whose reply lands in `queue` under `label`."""
        return (self, 0, [_Peer(peer), label])  # type: ignore[return-value]

    def send(self, route: Route, frames: list[Buffer]) -> None:
        self.queue.put((route[2][1], frames))
