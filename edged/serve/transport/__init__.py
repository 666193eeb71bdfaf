"""The sockets: binding, CURVE, the serving loop and its stand-in; and `Transport`, all
that the rest of serving may ask of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from edged.wire.codec import Buffer


class Transport(Protocol):
    """What lanes, dispatch and the daemon ask of the sockets (edged.serve.transport.server.Server)."""

    def reply(self, route: Any, frames: list[Buffer]) -> None:
        """Send one reply to the peer `route` names, from any thread."""
        ...

    @property
    def unroutable(self) -> int:
        """Replies whose peer was gone or not reading."""
        ...

    def wake(self) -> None:
        """Make the loop take a turn now (safe from signal handlers)."""
        ...

    def ask(self, question: Callable[[], Any], timeout_s: float) -> Any:
        """Run `question` on the loop's thread and return its answer (from any other thread)."""
        ...

    def run_aside(self, call: Callable[[], None]) -> bool:
        """Run `call` on the loop's own thread while a stand-in serves the sockets; False
        (and `call` not run) on any other thread."""
        ...
