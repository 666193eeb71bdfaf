"""Turns between the loops: a loop gives way while a loop of a higher class is awake.

The loops share one interpreter lock. A bulk loop reading a burst holds it for most of
each switch interval (0.5 ms), and a realtime request needs it several times (to read,
admit, run inline and reply): left to chance, it waited for several intervals at each
step. So a loop marks itself awake from the moment its poll returns until it sleeps
again, and a lower loop, between two messages or two callables, waits while any higher
one is awake: the higher loop then waits for the lock once, not at every step.
"""

from __future__ import annotations

import threading

# A loop that gives way looks again at least this often: a wake-up missed in a race
# costs it this long at most.
WAIT_SLICE_S = 0.001


class Turns:
    """Which loops are awake, by rank (a class's place, 0 first). Each loop writes its
    own slot alone (`wake`, `sleep`); any loop reads the others'."""

    def __init__(self, ranks: int) -> None:
        self._awake = [False] * ranks
        self._turn = threading.Condition()
        self._waiting = 0  # loops inside wait_below; written under _turn

    def wake(self, rank: int) -> None:
        self._awake[rank] = True

    def sleep(self, rank: int) -> None:
        self._awake[rank] = False
        # Read without the lock, so that a sleep costs nothing when nobody waits; a
        # wake-up missed in a race costs the waiter one WAIT_SLICE_S.
        if self._waiting:
            with self._turn:
                self._turn.notify_all()

    def higher_awake(self, rank: int) -> bool:
        return any(self._awake[:rank])

    def wait_below(self, rank: int) -> None:
        """Block while a loop of a higher class is awake."""
        with self._turn:
            self._waiting += 1
            while any(self._awake[:rank]):
                self._turn.wait(WAIT_SLICE_S)
            self._waiting -= 1
