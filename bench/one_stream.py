"""The GPU benchmark's ablation backend: onnxruntime-cuda with every lane's sessions on
ONE CUDA stream, at priority 0, made once per daemon, so realtime's work queues behind
bulk's in one FIFO (and each call's synchronize waits for the other lane's work too).
For measuring what the per-lane priority streams buy; never for serving.

Run as a script, it is `edged` with this backend registered as
"onnxruntime-cuda-one-stream". Ran on an NVIDIA H200 and an NVIDIA H100 (2026-11-27; docs/benchmarks-gpu.md).
"""

from __future__ import annotations

import sys
import threading

from edged.backends import BACKENDS, VARIANTS_OF, cuda
from edged.backends.onnxruntime_cuda import OnnxRuntimeCuda
from edged.backends.onnxruntime_cuda_runner import DEVICE, OnnxRuntimeCudaRunner
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry

NAME = "onnxruntime-cuda-one-stream"


class OneStreamCuda(OnnxRuntimeCuda):
    """Its one stream is made by the first lane worker to load, under `_lock`, and lives
    as long as the process (the runners do not own it)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._stream: cuda.Stream | None = None

    def load(self, model: ModelEntry, lane: ClassConfig) -> OnnxRuntimeCudaRunner:
        with self._lock:
            if self._stream is None:
                cuda.set_device(DEVICE)
                self._stream = cuda.Stream(0)
        return OnnxRuntimeCudaRunner(self._ort, model, lane, self.reservation_of(model, lane), stream=self._stream)


if __name__ == "__main__":
    from edged.cli.commands import main

    BACKENDS[NAME] = "one_stream:OneStreamCuda"
    VARIANTS_OF[NAME] = "onnxruntime"
    sys.exit(main())
