"""Precedence between lanes: the one piece of state a daemon's lanes share.

The lanes run on one device (the CPU's cores, or one GPU). Left alone, a bulk batch
computes beside a realtime request and slows it down. Two rules keep a higher class's
latency while a lower one floods the same device:
- yield: a lane that yields starts no backend call while a higher lane has work
  queued or running;
- cap: its calls are sized to finish within its `max_call_ms` (edged.serve.lanes.worker),
  so a higher arrival waits behind at most one short call.
"""

from __future__ import annotations

import threading
from typing import Protocol

# A yielding worker re-checks at least this often, so that a wake-up that raced
# with its wait costs at most this long.
WAIT_SLICE_S = 0.005


class Depth(Protocol):
    """What precedence reads of a lane's backlog."""

    @property
    def depth(self) -> int: ...

    @property
    def work_ns(self) -> int: ...

    def yielding(self, waiting: bool) -> None:
        """Its workers start or end waiting for the higher classes (its pace leaves that time out)."""


class Precedence:
    """Who may compute now, shared by one generation of lanes. Each lane joins once,
    when the loader builds it; after that the lanes' backlogs are only read here."""

    def __init__(self) -> None:
        self._lanes: list[tuple[int, Depth]] = []
        self._turn = threading.Condition()
        self._waiting = 0  # workers inside wait_turn; written under _turn

    def join(self, order: int, backlog: Depth) -> None:
        self._lanes.append((order, backlog))

    def busy_above(self, order: int) -> bool:
        """Whether a lane of a higher class (a lower order) has work queued or running."""
        return any(backlog.depth for other, backlog in self._lanes if other < order)

    def work_above(self, order: int) -> int:
        """The estimated work, in ns, that higher classes hold: a yielding lane waits for it all."""
        return sum(backlog.work_ns for other, backlog in self._lanes if other < order)

    def wait_turn(self, order: int) -> None:
        """Block while a higher class has work (a yielding worker, before each call)."""
        if not self.busy_above(order):
            return
        own = next(backlog for other, backlog in self._lanes if other == order)
        own.yielding(True)
        with self._turn:
            self._waiting += 1
            while self.busy_above(order):
                self._turn.wait(WAIT_SLICE_S)
            self._waiting -= 1
        own.yielding(False)

    def idle(self) -> None:
        """A lane has just run dry: wake the workers that yield to it."""
        # Read without the lock, so that a lane's every answer costs no lock when nobody
        # waits; a wake-up missed in a race costs the waiter one WAIT_SLICE_S.
        if self._waiting:
            with self._turn:
                self._turn.notify_all()
