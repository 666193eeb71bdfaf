"""Turns between the loops: every other loop gives way while the highest class's loop is awake.

The loops share one interpreter lock. A realtime request needs it several times (read,
admit, run, reply), and a loop reading a burst holds it for most of each 0.5 ms switch
interval; giving way, the highest loop waits for the lock once a turn, not at every step.
The other loops share the lock as Python shares it: giving way to every loop above them
slowed bulk's bursts (docs/operations.md, "Turns").
"""

from __future__ import annotations

import threading

# A waiting loop looks again this often: a wake-up missed in a race costs at most this.
WAIT_SLICE_S = 0.001


class Turns:
    """Whether the highest class's loop is awake: written by that loop alone (`top_awake`
    as it wakes, `sleep`), read by the others (`top_awake`, `wait`). A plain attribute, not
    a property: every other loop reads it before each message and callback."""

    def __init__(self) -> None:
        self.top_awake = False
        self._turn = threading.Condition()
        self._waiting = 0  # loops inside wait(); written under _turn

    def sleep(self) -> None:
        self.top_awake = False
        # Read without the lock: a sleep costs nothing when nobody waits.
        if self._waiting:
            with self._turn:
                self._turn.notify_all()

    def wait(self) -> None:
        """Block while the highest class's loop is awake."""
        with self._turn:
            self._waiting += 1
            while self.top_awake:
                self._turn.wait(WAIT_SLICE_S)
            self._waiting -= 1
