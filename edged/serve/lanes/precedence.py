"""Precedence between lanes: the one piece of state a daemon's lanes share.

On one device a bulk batch slows a realtime request beside it, so a yielding lane starts no
call while a higher lane has work queued or running, and sizes its calls to its `max_call_ms`
(edged.serve.lanes.worker): a higher arrival waits behind at most one short call.
"""

from __future__ import annotations

import threading

from edged.serve.admission import Backlog

# A yielding worker re-checks this often, bounding the cost of a wake-up lost in a race.
WAIT_SLICE_S = 0.005


class Precedence:
    """Who may compute now, for one generation of lanes. Each lane joins once, when the loader
    builds it; after that their backlogs are only read here."""

    def __init__(self) -> None:
        self._lanes: list[tuple[int, Backlog]] = []
        self._turn = threading.Condition()
        self._waiting = 0  # workers inside wait_turn; written under _turn

    def join(self, order: int, backlog: Backlog) -> None:
        self._lanes.append((order, backlog))

    def busy_above(self, order: int) -> bool:
        """Whether a higher class (a lower order) has work queued or running."""
        return any(backlog.depth for other, backlog in self._lanes if other < order)

    def work_above(self, order: int) -> int:
        """The estimated ns of work higher classes hold: a yielding lane waits for it all."""
        return sum(backlog.work_ns for other, backlog in self._lanes if other < order)

    def wait_turn(self, order: int) -> None:
        """Block while a higher class has work; a yielding worker calls it before each call."""
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
        # Unlocked read, so answers cost no lock when nobody waits; a missed wake-up costs one WAIT_SLICE_S.
        if self._waiting:
            with self._turn:
                self._turn.notify_all()
