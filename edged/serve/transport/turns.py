"""Turns between the loops: every other loop gives way while the highest class's loop is awake.

The loops share one interpreter lock. A loop reading a burst holds it for most of each
switch interval (0.5 ms), and a realtime request needs it several times (to read,
admit, run inline and reply): left to chance, it waited for several intervals at each
step. So the highest class's loop marks itself awake from the moment its poll returns
until it sleeps again, and every other loop, between two messages or two callables,
waits while it is awake: the highest loop then waits for the lock once, not at every step.

The other loops share the lock as Python shares it. Made to give way to every loop above
it, bulk's loop waited whenever the shared endpoints' loop was awake: through the whole
of a burst that loop read for bulk, whose admissions then came in late, large batches.
The burst took 3.0-3.6x the bare floor's time, against 2.0-3.2x giving way to the
highest loop alone, and realtime fared no better (bench/burst.py, 2026-11-27:
docs/benchmarks.md, "Realtime beside a burst").
"""

from __future__ import annotations

import threading

# A loop that gives way looks again at least this often: a wake-up missed in a race
# costs it this long at most.
WAIT_SLICE_S = 0.001


class Turns:
    """Whether the highest class's loop is awake: written by that loop alone (`wake`,
    `sleep`), read by the others (`top_awake`, `wait`)."""

    def __init__(self) -> None:
        self._top_awake = False
        self._turn = threading.Condition()
        self._waiting = 0  # loops inside wait(); written under _turn

    def wake(self) -> None:
        self._top_awake = True

    def sleep(self) -> None:
        self._top_awake = False
        # Read without the lock, so that a sleep costs nothing when nobody waits; a
        # wake-up missed in a race costs the waiter one WAIT_SLICE_S.
        if self._waiting:
            with self._turn:
                self._turn.notify_all()

    @property
    def top_awake(self) -> bool:
        return self._top_awake

    def wait(self) -> None:
        """Block while the highest class's loop is awake."""
        with self._turn:
            self._waiting += 1
            while self._top_awake:
                self._turn.wait(WAIT_SLICE_S)
            self._waiting -= 1
