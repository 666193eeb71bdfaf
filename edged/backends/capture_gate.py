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

Beside the runners, every other CUDA call of the backend that a capture forbids goes
through the gate: the loader's copy of a model's weights to the device (an allocation
and a synchronous copy, `hold_weights`) and the socket loop's opening of a client's
CUDA IPC handle wait, shared, for a capture to end; closing an IPC handle, which
happens wherever the last reference to its memory goes (a finalizer, on any thread,
the capturing one included), never waits: it runs at once outside a capture, else is
deferred to the capture's end and run by the capturing thread before it lets anyone in.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("edged.cuda")


class CaptureGate:
    """A readers-writer lock that prefers its writer: shared for CUDA work, exclusive
    for a capture."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._shared = 0  # holders of the shared side now
        self._capturing = False
        self._waiting = 0  # captures waiting: no new shared holder gets in before them
        self._deferred: list[Callable[[], None]] = []  # calls put off until the capture ends

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

    def outside_capture(self, call: Callable[[], None]) -> None:
        """Run `call` now if no capture runs or waits, else when the capture ends. Never
        blocks, so a finalizer may use it from any thread, the capturing one included."""
        with self._changed:
            if self._capturing or self._waiting:
                self._deferred.append(call)
                return
            self._shared += 1
        try:
            call()
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
            # The capture is over and nothing else runs yet: the calls put off until now run here.
            with self._changed:
                deferred, self._deferred = self._deferred, []
            for call in deferred:
                try:
                    call()
                except Exception:  # a failed close must not leave the gate shut
                    log.exception("a CUDA call deferred until a capture ended failed")
            with self._changed:
                self._capturing = False
                self._changed.notify_all()


CAPTURE_GATE = CaptureGate()
