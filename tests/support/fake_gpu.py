"""A GPU backend for a machine with none: the test says so in its name wherever it is used.

It plans lane memory exactly as the CUDA backend does (the same arithmetic, the same
refusal), against a GPU called "Fake GPU" whose free memory the test sets in
EDGED_FAKE_GPU_FREE_MB, and runs the models on ONNX Runtime's CPU provider. Each
session it loads takes EDGED_FAKE_GPU_SESSION_MB (default 0) off that free memory until
it closes, so that the loader's measurement has something to measure; the first also
takes EDGED_FAKE_GPU_CONTEXT_MB (default 0) for good, as a CUDA context's one-time costs. What it shows is
the daemon's wiring of a reserving backend (the refusals, the `stats` and `models`
fields), not anything about a GPU.

Run as a script, it is `edged` with this backend registered as "fake-gpu".
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from edged.backends import BACKENDS, VARIANTS_OF, Runner
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


class _Held:
    """A CPU runner that gives its share of the fake device memory back when it closes."""

    def __init__(self, runner: Runner, give_back: Callable[[], None]) -> None:
        self._runner, self._give_back = runner, give_back

    def run(self, *args: Any, **options: Any) -> Any:
        return self._runner.run(*args, **options)

    def close(self) -> None:
        self._runner.close()
        self._give_back()


if __name__ == "__main__":
    from edged.cli.commands import main

    BACKENDS["fake-gpu"] = "fake_gpu:FakeGpu"
    VARIANTS_OF["fake-gpu"] = "onnxruntime"
    sys.exit(main())
