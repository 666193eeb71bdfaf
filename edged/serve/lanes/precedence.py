"""Precedence between lanes: the one piece of state a daemon's lanes share.

The lanes run on one device (the CPU's cores, or one GPU). Left alone, a bulk batch
computes beside a realtime request and slows it down. Three rules keep a higher
class's latency while a lower one floods the same device:
- yield: a lane that yields starts no backend call while a higher lane has work
  queued or running;
- cap: its calls are sized to finish within its `max_call_ms`, so a higher arrival
  waits behind at most one short call;
- preemption: when a higher arrival would miss its deadline behind a preemptible
  call in flight, that call is cancelled and its jobs run again later (inference
  is idempotent; REEF, OSDI'22, does the same on a GPU).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

from edged.backends import CallStop

# A yielding worker re-checks at least this often, so that a wake-up that raced
# with its wait costs at most this long.
WAIT_SLICE_S = 0.005


class Depth(Protocol):
    """What precedence reads of a lane's backlog."""

    @property
    def depth(self) -> int: ...

    @property
    def work_ns(self) -> int: ...


@dataclass(slots=True)
class _Flight:
    order: int
    started_ns: int
    predicted_ns: int
    stop: CallStop


class Precedence:
    """Who may compute now, shared by one generation of lanes.

    Writers: each lane joins once, when it is built; a worker adds and removes its
    own call in flight (`take_off`, `land`); only the socket loop cancels
    (`make_room`). Lanes are read, never written, from here.
    """

    def __init__(self) -> None:
        self._lanes: list[tuple[int, Depth]] = []
        self._flights: dict[int, _Flight] = {}  # by id of the call's stop
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
        with self._turn:
            self._waiting += 1
            while self.busy_above(order):
                self._turn.wait(WAIT_SLICE_S)
            self._waiting -= 1

    def idle(self) -> None:
        """A lane has just run dry: wake the workers that yield to it."""
        # Read without the lock, so that a lane's every answer costs no lock when nobody
        # waits; a wake-up missed in a race costs the waiter one WAIT_SLICE_S.
        if self._waiting:
            with self._turn:
                self._turn.notify_all()

    def take_off(self, order: int, stop: CallStop, predicted_ns: int, now_ns: int) -> None:
        self._flights[id(stop)] = _Flight(order, now_ns, predicted_ns, stop)

    def land(self, stop: CallStop) -> None:
        self._flights.pop(id(stop), None)

    @property
    def flying(self) -> bool:
        """Whether any preemptible call is in flight (read by the loop on each arrival)."""
        return bool(self._flights)

    def make_room(self, order: int, slack_ns: int, now_ns: int) -> int:
        """Cancel each preemptible call of a lower class whose predicted remaining time
        exceeds `slack_ns`, the time a new request of class `order` can spare; returns
        how many were cancelled (socket loop only)."""
        cancelled = 0
        for flight in list(self._flights.values()):
            remaining_ns = flight.started_ns + flight.predicted_ns - now_ns
            if flight.order > order and remaining_ns > slack_ns and not flight.stop.cancelled:
                flight.stop.cancel()
                cancelled += 1
        return cancelled
