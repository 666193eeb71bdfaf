"""Where an admitted job runs: the three routes, behind one small protocol.

`Lane.place` offers a job to its routes in order, and the first that takes it owns it
until it is answered. Each route runs the job through the same two steps as the others
(`ClassStats.call` before the backend call, `Answers.result` after it), so a figure
means the same whichever route a request took.

- `Inline`: on the socket loop itself, now (a cheap job on an idle lane).
- `Aside`: on the loop's thread, now, while the stand-in serves the sockets (a dearer
  job on an idle lane).
- `Queued`: onto the lane's queue, for its workers (always takes the job).
"""

from __future__ import annotations

import queue
from typing import Any, Protocol

from edged.serve.lanes.batching import Job
from edged.serve.lanes.inline import InlinePath
from edged.serve.stats import ClassStats
from edged.serve.transport import Transport


class Route(Protocol):
    def take(self, job: Job) -> bool:
        """Run or queue `job`, which this route then answers; False: not this route, now."""
        ...


class Queued:
    """The lane's workers (edged.serve.lanes.worker)."""

    def __init__(self, jobs: queue.SimpleQueue[Any]) -> None:
        self._jobs = jobs

    def take(self, job: Job) -> bool:
        self._jobs.put(job)
        return True


class Inline:
    """The loop runs the job itself, now, when it is cheap enough (edged.serve.lanes.inline)."""

    def __init__(self, path: InlinePath, stats: ClassStats) -> None:
        self._path = path
        self._stats = stats

    def take(self, job: Job) -> bool:
        # Only the loop's thread calls its runners; the stand-in never does.
        if not (self._path.on_loop_thread and self._path.qualifies(job)):
            return False
        self._stats.inline += 1
        self._path.run(job)
        return True


class Aside:
    """The loop's thread runs the job, now, as a worker would, while the stand-in serves
    the sockets (edged.serve.transport.server.Server.run_aside)."""

    def __init__(self, path: InlinePath, stats: ClassStats, transport: Transport) -> None:
        self._path = path
        self._stats = stats
        self._transport = transport

    def take(self, job: Job) -> bool:
        if not self._path.on_loop_thread:
            return False

        def call() -> None:
            # Counted before the call answers: a client that reads the stats after its
            # reply (the stand-in answers it) must find the call counted.
            self._stats.aside += 1
            self._path.run_aside(job)

        return self._transport.run_aside(call)
