"""TensorRT engines on the GPU: one deserialized engine per model and precision in the
process (edged.backends.tensorrt_engines), its weights held and counted once, and one
execution context per lane worker (edged.backends.tensorrt_runner), on its own priority
stream, with its own activation memory and preallocated buffers.

Written against TensorRT 10/11's documented Python API and cuda-python; NOT YET RUN
on a GPU (no machine here has TensorRT's builder, see docs/engines.md). What runs
and is tested without a GPU: the refusal where CUDA or TensorRT is missing, engine
selection (edged.models.engines), the fallback to ONNX Runtime, and the runner's
checks and life cycle on fakes of TensorRT and CUDA (tests/backends/test_gpu_fakes.py).

Engines are built with no auxiliary streams (edged.toolchain.engine), so everything
a context launches goes on the lane's own priority stream.

The CUDA device is checked through cuda-python before any TensorRT object exists:
a TensorRT runtime created without a device deserializes into a segfault.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from edged.backends import BackendError, DeviceMemory, DeviceTensor, Runner, cuda
from edged.backends.onnxruntime_cuda import open_ipc
from edged.backends.shared import Weights, WeightsHold, file_key
from edged.backends.tensorrt_engines import ENGINES, Chosen, deserialize
from edged.backends.tensorrt_runner import TensorRtRunner
from edged.config.classes import ClassConfig
from edged.models.engines import Environment, select
from edged.models.repository import ModelEntry, sha256_of
from edged.models.warmup import load_failure

log = logging.getLogger("edged.tensorrt")

SERVE_HINT = (
    "install the TensorRT runtime: `pip install tensorrt` from NVIDIA's package index, "
    "or `pip install tensorrt-lean` for version-compatible engines"
)


def import_tensorrt() -> tuple[Any, bool]:
    """The TensorRT module and whether it is the lean runtime; the full one is preferred."""
    try:
        import tensorrt

        return tensorrt, False
    except ImportError:
        pass
    try:
        import tensorrt_lean

        return tensorrt_lean, True
    except ImportError:
        raise BackendError(f"TensorRT is not installed: {SERVE_HINT}") from None


def environment() -> tuple[Environment, Any]:
    """This GPU and runtime, checking CUDA first; raises BackendError with the fix."""
    reason = cuda.cuda_available()
    if reason is not None:
        raise BackendError(f"the tensorrt backend needs a CUDA GPU, and {reason}")
    trt, lean = import_tensorrt()
    try:
        device = cuda.device_info(0)
    except cuda.CudaError as exc:
        raise BackendError(f"the tensorrt backend cannot read the GPU's properties: {exc}") from None
    return Environment(device.name, device.compute_capability, trt.__version__, lean), trt


class TensorRt:
    """Backend "tensorrt". `fallback="onnxruntime"` serves the model's ONNX of the same
    precision on the CPU where no engine fits (server.fallback); each refusal is logged.
    Its mutable fields, the engines chosen and each one's context memory, are written by
    the loader and the loading workers, under `_lock`."""

    fixed_rows = True  # each runner's buffers hold its class's max_batch rows

    def __init__(self, fallback: str | None = None) -> None:
        self._fallback = fallback
        self._lock = threading.Lock()
        self._chosen: dict[str, Chosen] = {}  # by model, chosen once per load of the daemon
        self._context_bytes: dict[str, int] = {}  # by model: each runner's activation memory

    def load(self, model: ModelEntry, lane: ClassConfig) -> Runner:
        try:
            trt, chosen = self._choose(model)
            held = ENGINES.take(chosen.key, lambda: deserialize(trt, chosen))
        except BackendError as exc:
            return self._fall_back(model, lane, str(exc))
        runner = TensorRtRunner(trt, held.engine, model.signature, lane, lambda: ENGINES.give_back(chosen.key))
        with self._lock:
            self._context_bytes[model.name] = runner.activation_bytes
        return runner

    def open_ipc(self, handle: bytes, nbytes: int) -> DeviceMemory:
        return open_ipc(handle, nbytes)

    def weights_plan(self, model: ModelEntry, classes: Sequence[ClassConfig]) -> Weights:
        """One engine per model, whatever its lanes; none where its lanes will fall back."""
        try:
            _, chosen = self._choose(model)
        except BackendError:
            return Weights(model.name, 0, 0, 0)  # its lanes fall back, or fail saying why, as they load
        new = 0 if ENGINES.holds(chosen.key) else 1
        return Weights(model.name, 1, new, chosen.path.stat().st_size, draining=ENGINES.replaced(chosen.key))

    def hold_weights(self, model: ModelEntry, classes: Sequence[ClassConfig]) -> WeightsHold:
        """Deserialize the model's engine now, measured as the drop in free device memory."""
        plan = self.weights_plan(model, classes)
        if not plan.copies:
            return WeightsHold(plan, lambda: None)
        trt, chosen = self._choose(model)
        before = cuda.memory_info()[0]
        try:
            ENGINES.take(chosen.key, lambda: deserialize(trt, chosen))
        except BackendError as exc:
            if self._fallback is None:
                raise load_failure(model.name, chosen.path, exc) from exc
            return WeightsHold(Weights(model.name, 0, 0, 0), lambda: None)  # the lanes fall back, saying why
        added = max(0, before - cuda.memory_info()[0])
        return WeightsHold(replace(plan, added_bytes=added), lambda: ENGINES.give_back(chosen.key))

    def describe(self, model: ModelEntry) -> dict[str, Any]:
        with self._lock:
            chosen, context = self._chosen.get(model.name), self._context_bytes.get(model.name)
        if chosen is None or context is None:
            return {}
        # The engine (its weights) once, in `weights`; this, per lane worker: its activation memory.
        return {"engine": {"file": chosen.record.file, "context_bytes_per_worker": context}}

    def _choose(self, model: ModelEntry) -> tuple[Any, Chosen]:
        """TensorRT and the engine this GPU runs for `model`; BackendError where there is none."""
        env, trt = environment()
        with self._lock:
            if model.name not in self._chosen:
                folder = model.variant.path
                sources = {e.source_file for e in model.variant.engines}
                digests = {name: sha256_of(folder / name) if (folder / name).is_file() else None for name in sources}
                chosen = select(model.variant.engines, env, digests)
                if chosen.engine is None:
                    raise BackendError(chosen.explain(model.name))
                for reason in chosen.refusals:
                    log.info("%s: passed over %s", model.name, reason)
                path = folder / chosen.engine.file
                self._chosen[model.name] = Chosen(path, chosen.engine, file_key(path))
            return trt, self._chosen[model.name]

    def _fall_back(self, model: ModelEntry, lane: ClassConfig, why: str) -> Runner:
        if self._fallback != "onnxruntime":
            raise BackendError(f'{why} (set server.fallback = "onnxruntime" to serve its ONNX instead)')
        if model.variant.fallback is None:
            raise BackendError(f"{why}; and {model.name} has no onnxruntime variant to fall back to")
        from edged.backends.onnxruntime_cpu import OnnxRuntimeCpuRunner

        log.warning("%s: serving its ONNX on ONNX Runtime's CPU provider instead: %s", model.name, why)
        variant = replace(model.variant, backend="onnxruntime", path=model.variant.fallback, engines=())
        return HostInputs(OnnxRuntimeCpuRunner(replace(model, variant=variant), lane))


class HostInputs:
    """A fallback runner on the CPU, in a daemon that takes CUDA IPC regions: an input in
    device memory is copied to the host first, the one place such an input goes through it."""

    def __init__(self, runner: Runner) -> None:
        self._runner = runner

    def run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        on_host = {
            name: cuda.download_now(value) if isinstance(value, DeviceTensor) else value
            for name, value in inputs.items()
        }
        return self._runner.run(on_host, output_names)

    def close(self) -> None:
        self._runner.close()
