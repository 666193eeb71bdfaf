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

# What health, stats and Prometheus show: protocol v1 has three states.
REPORTED: dict[State, str] = {
    State.STARTING: "starting",
    State.SERVING: "serving",
    State.RELOADING: "serving",
    State.DRAINING: "draining",
    State.STOPPING: "starting",
}
REPORTED_STATES = tuple(dict.fromkeys(REPORTED.values()))


class Lifecycle:
    """The daemon's current state. One writer, the thread that made it (the steering thread,
    edged.daemon.daemon); any thread may read it."""

    def __init__(self) -> None:
        self.state = State.STARTING
        self._owner = threading.get_ident()

    def check_owner(self) -> None:
        if threading.get_ident() != self._owner:
            thread = threading.current_thread().name
            raise RuntimeError(f"the daemon's life is steered by its own thread only, not by {thread!r}")

    def move(self, to: State) -> None:
        """Go to `to`; raises on a move MOVES does not list, or from another thread."""
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
