"""A GPU backend for a machine with none: the test says so in its name wherever it is used.

It plans lane memory exactly as the CUDA backend does (the same arithmetic, the same
refusal), against a GPU called "Fake GPU" whose free memory the test sets in
EDGED_FAKE_GPU_FREE_MB, and runs the models on ONNX Runtime's CPU provider. Each
session it loads takes EDGED_FAKE_GPU_SESSION_MB (default 0) off that free memory until
it closes, so that the loader's measurement has something to measure; the first also
takes EDGED_FAKE_GPU_CONTEXT_MB (default 0) for good, as a CUDA context's one-time costs. What it shows is
the daemon's wiring of a reserving backend (the refusals, the `stats` and `models`
fields), not anything about a GPU.

It also takes CUDA IPC regions (edged.backends.OpeningIpc), faked with host memory: the
64-byte "handle" is a POSIX shared-memory object's name, NUL-padded, which `open_ipc`
maps; a runner reads a DeviceTensor input from that mapping. Each open, read and close
is a line in the file EDGED_FAKE_GPU_IPC_LOG names, and a read waits
EDGED_FAKE_GPU_IPC_RUN_S (default 0) first, so that a test can act while it runs; an open
of an object whose name ends in `-slow` waits EDGED_FAKE_GPU_IPC_OPEN_S (default 0).

Run as a script, it is `edged` with this backend registered as "fake-gpu".
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends import BACKENDS, VARIANTS_OF, BackendError, DeviceTensor, Runner
from edged.backends.gpu_memory import MIB, LaneReservation, reserve_lanes
from edged.backends.onnxruntime_cpu import OnnxRuntimeCpu
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry

DEVICE_NAME = "Fake GPU"


class FakeGpu(OnnxRuntimeCpu):
    fixed_rows = True  # as the GPU backends: requests past max_batch rows are refused at admission
    device_name = DEVICE_NAME

    def __init__(self) -> None:
        super().__init__()
        self._free = int(os.environ["EDGED_FAKE_GPU_FREE_MB"]) * MIB
        self._per_session = int(os.environ.get("EDGED_FAKE_GPU_SESSION_MB", "0")) * MIB
        # Taken by the process's first session and never given back, as a CUDA context's modules are.
        self._context = int(os.environ.get("EDGED_FAKE_GPU_CONTEXT_MB", "0")) * MIB
        self._lock = threading.Lock()  # workers load on their own threads

    def free_bytes(self) -> int:
        with self._lock:
            return self._free

    def reserve(
        self, models: Sequence[ModelEntry], classes: Sequence[ClassConfig], free_bytes: int
    ) -> dict[str, LaneReservation]:
        return reserve_lanes(models, classes, free_bytes, DEVICE_NAME)

    def warm_context(self, models: Sequence[ModelEntry]) -> int:
        before = self.free_bytes()
        self.load(models[0], ClassConfig("context", order=0)).close()
        return before - self.free_bytes()

    def load(self, model: ModelEntry, lane: ClassConfig) -> Runner:
        self._take(self._per_session + self._context)
        self._context = 0
        return _Held(super().load(model, lane), lambda: self._take(-self._per_session))

    def _take(self, nbytes: int) -> None:
        with self._lock:
            self._free -= nbytes

    def open_ipc(self, handle: bytes, nbytes: int) -> FakeIpcMemory:
        return FakeIpcMemory(handle, nbytes)


def note(line: str) -> None:
    """One line in the fake's IPC log, if a test asked for one."""
    if path := os.environ.get("EDGED_FAKE_GPU_IPC_LOG"):
        with open(path, "a") as log:
            log.write(line + "\n")


class FakeIpcMemory:
    """A POSIX shared-memory object standing in for a client's device allocation."""

    def __init__(self, handle: bytes, nbytes: int) -> None:
        name = handle.rstrip(b"\0").decode()
        if name.endswith("-slow"):
            note(f"opening {name}")
            time.sleep(float(os.environ.get("EDGED_FAKE_GPU_IPC_OPEN_S", "0")))
        try:
            with open(Path("/dev/shm") / name, "r+b") as file:
                self._mapping = mmap.mmap(file.fileno(), 0)
        except (OSError, ValueError) as exc:
            raise BackendError(f"the daemon cannot open this CUDA IPC handle: {exc}") from None
        if nbytes > len(self._mapping):
            raise BackendError(f"its allocation has {len(self._mapping)} bytes, fewer than the {nbytes} registered")
        self._anchor = ctypes.c_char.from_buffer(self._mapping)
        self.pointer, self.nbytes = ctypes.addressof(self._anchor), nbytes
        note(f"open {name}")
        weakref.finalize(self, note, f"close {name}")


class _Held:
    """A CPU runner that gives its share of the fake device memory back when it closes."""

    def __init__(self, runner: Runner, give_back: Callable[[], None]) -> None:
        self._runner, self._give_back = runner, give_back

    def run(self, inputs: dict[str, Any], *args: Any, **options: Any) -> Any:
        device = {name: value for name, value in inputs.items() if isinstance(value, DeviceTensor)}
        if device:
            time.sleep(float(os.environ.get("EDGED_FAKE_GPU_IPC_RUN_S", "0")))
            note(f"read {' '.join(device)}")
            inputs = {**inputs, **{name: read(tensor) for name, tensor in device.items()}}
        return self._runner.run(inputs, *args, **options)

    def close(self) -> None:
        self._runner.close()
        self._give_back()


def read(tensor: DeviceTensor) -> np.ndarray:
    raw = (ctypes.c_char * tensor.nbytes).from_address(tensor.pointer)
    return np.frombuffer(raw, tensor.dtype).reshape(tensor.shape).copy()


if __name__ == "__main__":
    from edged.cli.commands import main

    BACKENDS["fake-gpu"] = "fake_gpu:FakeGpu"
    VARIANTS_OF["fake-gpu"] = "onnxruntime"
    sys.exit(main())
