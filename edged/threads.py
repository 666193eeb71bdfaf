"""Threads the kernel knows by name: `top -H`, `ps -L`, a profiler and /proc show a daemon's
threads as serve-bulk or lane-bulk-0 rather than as many `python`, and the threads a runtime
starts from one (ONNX Runtime's pool) carry its name too, as Linux copies it to them."""

from __future__ import annotations

import threading
from pathlib import Path

COMM_BYTES = 15  # the kernel keeps 16 bytes of a thread's name, its terminating NUL among them


class NamedThread(threading.Thread):
    """A `threading.Thread` that gives its name to its kernel thread as it starts."""

    def run(self) -> None:
        name_native(self.name)
        super().run()


def name_native(name: str) -> None:
    """Name the calling thread for the kernel: the first 15 bytes of `name`, where /proc allows it."""
    try:
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_bytes(name.encode()[:COMM_BYTES])
    except OSError:  # not Linux, or /proc not mounted: the name is for people, never a failure
        pass
