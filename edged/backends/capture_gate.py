"""One gate for the process's CUDA work while ONNX Runtime captures a CUDA graph.

ONNX Runtime's CUDA provider captures in global mode ("cuda graph can only work with
a single thread"): while one thread captures, a CUDA call that is unsafe during
capture (an allocation, a synchronous copy, creating a stream) on any other thread
invalidates the capture and fails that call. Captures happen at load, at start-up and
on a reload, when other lanes may be serving. So every runner of the backend holds
the gate shared around its CUDA work (load, run, close), and exclusively around the
warm-up runs that capture; exclusive waits for the shared holders to leave and lets
no new one in. A lane serving beside a capture pauses for one batch size's capture
runs, then goes on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class CaptureGate:
    """A readers-writer lock that prefers its writer: shared for CUDA work, exclusive
    for a capture."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._shared = 0  # holders of the shared side now
        self._capturing = False
        self._waiting = 0  # captures waiting: no new shared holder gets in before them

    def enter(self) -> None:
        """Take the shared side (explicit, for the run path: no generator per call)."""
        with self._changed:
            while self._capturing or self._waiting:
                self._changed.wait()
            self._shared += 1

    def leave(self) -> None:
        with self._changed:
            self._shared -= 1
            if not self._shared:
                self._changed.notify_all()

    @contextmanager
    def shared(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.leave()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._changed:
            self._waiting += 1
            while self._capturing or self._shared:
                self._changed.wait()
            self._waiting -= 1
            self._capturing = True
        try:
            yield
        finally:
            with self._changed:
                self._capturing = False
                self._changed.notify_all()


CAPTURE_GATE = CaptureGate()
