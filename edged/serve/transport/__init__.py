"""The sockets and the loops that own them: the only serving modules that import zmq.
A reply goes back by its `Route`, sent by the loop that owns the request's socket."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edged.wire.codec import Buffer

if TYPE_CHECKING:
    from edged.serve.transport.loop import Loop

# Where a request came from: (its socket's loop, the socket's index there, the envelope); a tuple, made per request.
Route = tuple["Loop", int, list[Any]]
# handle(route, frames, received ns, more); `more`: another message already waits on that socket.
Handler = Callable[[Route, list[Buffer], int, bool], None]


def reply(route: Route, frames: list[Buffer]) -> bool:
    """Send one reply, from any thread. False: sent at once, on the socket's own loop, to a
    peer already gone (its connection closed)."""
    return route[0].send(route, frames)


def peer(route: Route) -> bytes:
    """Who sent the request: the same bytes for every request of one connection, and no other's
    (its socket's endpoint and its routing id, which a client may choose)."""
    return route[0].bound[route[1]].peer_prefix + route[2][0].bytes


def when_closed(route: Route, callback: Callable[[bytes], None]) -> bytes:
    """The request's connection (its peer and its descriptor); `callback` is called with it on
    the request's loop once it closes, an ipc connection's (a tcp one's end is not watched).
    Asked before the state it releases is made."""
    return route[0].when_closed(route[1], route[2][0], callback, peer(route))


def local(route: Route) -> bool:
    """Whether the request came on an ipc endpoint (a client on this machine)."""
    return route[0].bound[route[1]].local
