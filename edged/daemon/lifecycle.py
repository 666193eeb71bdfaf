"""The daemon's life cycle: its states, and every move between them in one table."""

from __future__ import annotations

import threading
from enum import StrEnum


class State(StrEnum):
    STARTING = "starting"  # sockets bound; the first configuration is loading
    SERVING = "serving"
    RELOADING = "reloading"  # serving, while a new configuration loads beside it
    DRAINING = "draining"  # stop asked while serving: new requests refused, admitted ones finish
    STOPPING = "stopping"  # stop asked before serving (or start-up failed): ends once the loader does


# The only moves there are. A reload ends in SERVING whether it was swapped in or refused.
MOVES: dict[State, frozenset[State]] = {
    State.STARTING: frozenset({State.SERVING, State.STOPPING}),
    State.SERVING: frozenset({State.RELOADING, State.DRAINING}),
    State.RELOADING: frozenset({State.SERVING, State.DRAINING}),
    State.DRAINING: frozenset(),
    State.STOPPING: frozenset(),
}

# What the health and stats ops and Prometheus show: protocol v1 has three states.
# A reload serves throughout; a stop before serving is still starting until it ends.
REPORTED: dict[State, str] = {
    State.STARTING: "starting",
    State.SERVING: "serving",
    State.RELOADING: "serving",
    State.DRAINING: "draining",
    State.STOPPING: "starting",
}
REPORTED_STATES = tuple(dict.fromkeys(REPORTED.values()))


class Lifecycle:
    """The daemon's current state. One writer, the thread that made it: the daemon's
    steering thread, which runs the socket loop (edged.daemon.daemon). A move from any other
    thread is a bug, and raises, as asyncio's loop checks its thread. Dispatch reads the
    state on whichever thread serves; the Prometheus endpoint reads `reported` from its own."""

    def __init__(self) -> None:
        self.state = State.STARTING
        self._owner = threading.get_ident()

    def check_owner(self) -> None:
        """Raise unless the calling thread is the one that steers the daemon's life."""
        if threading.get_ident() != self._owner:
            thread = threading.current_thread().name
            raise RuntimeError(f"the daemon's life is steered by its own thread only, not by {thread!r}")

    def move(self, to: State) -> None:
        """Go to `to`; a move that MOVES does not list, or from another thread, is a bug, and raises."""
        self.check_owner()
        if to not in MOVES[self.state]:
            raise RuntimeError(f"the daemon cannot go from {self.state} to {to}")
        self.state = to

    @property
    def reported(self) -> str:
        return REPORTED[self.state]

    @property
    def open(self) -> bool:
        """Whether inference requests are admitted."""
        return self.state in (State.SERVING, State.RELOADING)

    @property
    def stopping(self) -> bool:
        """Whether a stop was asked (or start-up failed)."""
        return self.state in (State.DRAINING, State.STOPPING)
