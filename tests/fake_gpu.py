"""A GPU backend for a machine with none: the test says so in its name wherever it is used.

It reserves lane memory exactly as the CUDA backend does (the same arithmetic, the
same refusal), against a GPU called "Fake GPU" whose free memory the test sets in
EDGED_FAKE_GPU_FREE_MB, and runs the models on ONNX Runtime's CPU provider. What it
shows is the daemon's wiring of a reserving backend (start-up refusal, the `stats`
and `models` fields), not anything about a GPU.

Run as a script, it is `edged` with this backend registered as "fake-gpu".
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from edged.backends import BACKENDS, VARIANTS_OF
from edged.backends.gpu_memory import MIB, LaneReservation, reserve_lanes
from edged.backends.onnxruntime_cpu import OnnxRuntimeCpu
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry

DEVICE_NAME = "Fake GPU"


class FakeGpu(OnnxRuntimeCpu):
    fixed_rows = True  # as the GPU backends: requests past max_batch rows are refused at admission

    def reserve(self, models: Sequence[ModelEntry], classes: Sequence[ClassConfig]) -> dict[str, LaneReservation]:
        free = int(os.environ["EDGED_FAKE_GPU_FREE_MB"]) * MIB
        return reserve_lanes(models, classes, free, DEVICE_NAME)


if __name__ == "__main__":
    from edged.cli import main

    BACKENDS["fake-gpu"] = "fake_gpu:FakeGpu"
    VARIANTS_OF["fake-gpu"] = "onnxruntime"
    sys.exit(main())
