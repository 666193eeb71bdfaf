"""The sockets: binding, CURVE, the serving loop and its stand-in. Here, the boundary
both ways: `Steering`, what the daemon gives the loop, and `Transport`, all that the
rest of serving may ask of the sockets."""

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
    def ingress(self) -> dict[str, list[str]]:
        """By class: the endpoints of the sockets that take that class alone."""
        ...

    @property
    def unroutable(self) -> int:
        """Replies whose peer was gone or not reading."""
        ...

    def peer(self, route: Any) -> bytes:
        """Who sent the request `route` answers: the same bytes for every request of one client."""
        ...

    def local(self, route: Any) -> bool:
        """Whether the request `route` answers came on an ipc endpoint (a client on this machine)."""
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


Route = tuple[int, list[Any]]  # (socket index, routing envelope)
# handle(route, frames, received ns, ingress: the class whose own socket it came on, None for a shared one)
Handler = Callable[[Route, list[Buffer], int, str | None], None]


class Steering(Protocol):
    """What the daemon gives the socket loop (`Server.run`): `handle` answers or admits a
    request; `keep_running` is asked before each sleep; `tick` is the loop's own thread's
    turn after every wake-up, and it alone steers the daemon; `serve_tick` is the
    stand-in's turn in its place, which serves and never steers; `spin_deadline_ns` says
    until when to poll rather than sleep (0: sleep now)."""

    def handle(self, route: Route, frames: list[Buffer], received_ns: int, ingress: str | None) -> None: ...
    def keep_running(self) -> bool: ...
    def tick(self) -> None: ...
    def serve_tick(self) -> None: ...
    def spin_deadline_ns(self) -> int: ...
