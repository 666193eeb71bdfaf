"""A Transport for lanes and dispatchers driven in-process, with no socket loop: each
reply is kept (or dropped), and nothing runs aside, as on a thread that is not the loop's."""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any

from edged.wire.codec import Buffer


class NoSockets:
    """Replies go to `replies`, when given; `run_aside` declines, so dear jobs queue."""

    unroutable = 0

    def __init__(self, replies: queue.SimpleQueue[tuple[Any, list[Buffer]]] | None = None) -> None:
        self._replies = replies

    @property
    def ingress(self) -> dict[str, list[str]]:
        return {}  # no sockets, so none of a class's own

    def reply(self, route: Any, frames: list[Buffer]) -> None:
        if self._replies is not None:
            self._replies.put((route, frames))

    def peer(self, route: Any) -> bytes:
        return b""

    def local(self, route: Any) -> bool:
        return True

    def wake(self) -> None:
        """Nothing to wake."""

    def ask(self, question: Callable[[], Any], timeout_s: float) -> Any:
        return question()

    def run_aside(self, call: Callable[[], None]) -> bool:
        return False
