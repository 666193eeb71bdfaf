"""ONNX Runtime on its CUDA provider: the backend, which plans each lane's device memory
and loads a runner per lane worker and model (edged.backends.onnxruntime_cuda_runner: a
session on the lane's own stream, its buffers bound, every batch size warmed up).

Each model's weights are on the device once, whatever the number of its sessions
(edged.backends.device_weights): every session takes them as shared initializers, so a
lane keeps its own stream, arena and CUDA graphs, never its own weights. What only a GPU
can confirm: that the CUDA provider uses those device OrtValues in place (ONNX Runtime
copies a shared initializer whose device differs from the one it planned, logging
"Cannot use user supplied initializer"), and what graph optimizations that rewrite a
weight keep per session; bench/gpu_checks.py weights measures both, per model and per
lane. A model whose dimensions other than the batch are dynamic is refused: its buffers
could not be sized at load.

Written against ONNX Runtime's and cuda-python's documented APIs; ran on an NVIDIA H200
and an H100 (docs/benchmarks-gpu.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from edged.backends import BackendError, cuda
from edged.backends.capture_gate import CAPTURE_GATE
from edged.backends.device_weights import DEVICE_WEIGHTS, load_device_weights, weights_key
from edged.backends.gpu_memory import LaneReservation, ModelReservation, io_bytes, reserve_lanes
from edged.backends.onnxruntime_cuda_runner import DEVICE, OnnxRuntimeCudaRunner
from edged.backends.onnxruntime_gpu import GPU_INSTALL, PROVIDER, load_cuda_libraries, runtime_conflict
from edged.backends.shared import Key, Weights, WeightsHold
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry
from edged.models.warmup import load_failure


class OnnxRuntimeCuda:
    """The backend. Construction checks that CUDA and the CUDA provider are here;
    `reserve` (the loader thread, before any lane loads) writes the plans that the
    workers' `load` then reads."""

    fixed_rows = True  # each runner's buffers hold its class's max_batch rows

    def __init__(self) -> None:
        reason = cuda.cuda_available()
        if reason is not None:
            raise BackendError(f'server.backend = "onnxruntime-cuda" cannot run here: {reason}')
        conflict = runtime_conflict()
        if conflict is not None:
            raise BackendError(f'server.backend = "onnxruntime-cuda" cannot run here: {conflict}')
        import onnxruntime as ort

        if PROVIDER not in ort.get_available_providers():
            raise BackendError(
                f'server.backend = "onnxruntime-cuda" needs onnxruntime-gpu, but this onnxruntime has no {PROVIDER}: '
                + GPU_INSTALL
            )
        load_cuda_libraries(ort)  # before its first CUDA session, or the provider drops silently
        self._ort = ort
        cuda.set_device(DEVICE)
        self.device = cuda.device_info(DEVICE)
        self.device_name = self.device.name
        self._plans: dict[str, LaneReservation] = {}
        self._cpu_nodes: dict[str, bool] = {}  # by model: any of its sessions has nodes on the CPU

    def free_bytes(self) -> int:
        return cuda.memory_info()[0]

    def warm_context(self, models: Sequence[ModelEntry]) -> int:
        """A session of the smallest model, at batch 1, loaded, run and freed: what stays taken
        afterwards is the process's one-time share (the context's modules, the libraries' first
        handles), which the first lane's measurement would otherwise absorb."""
        if not models:
            return 0
        model = min(models, key=lambda m: m.variant.path.stat().st_size)
        klass = ClassConfig("context", order=0)
        reservation = ModelReservation(model.name, 1, io_bytes(model, 1), 0)
        before = self.free_bytes()
        OnnxRuntimeCudaRunner(self._ort, model, klass, reservation).close()
        return max(0, before - self.free_bytes())

    def reserve(
        self, models: Sequence[ModelEntry], classes: Sequence[ClassConfig], free_bytes: int
    ) -> dict[str, LaneReservation]:
        """Plan every lane's memory and refuse if together the plans, and the weights not yet
        on the device, exceed `free_bytes`."""
        weights = [self.weights_plan(model, classes) for model in models]
        self._plans = reserve_lanes(models, classes, free_bytes, self.device_name, weights)
        return self._plans

    def weights_plan(self, model: ModelEntry, classes: Sequence[ClassConfig]) -> Weights:
        """One copy per model, whatever its lanes: new unless the serving lanes hold it already."""
        key = weights_key(model, DEVICE)
        new = 0 if DEVICE_WEIGHTS.holds(key) else 1
        return Weights(model.name, 1, new, model.variant.path.stat().st_size, draining=DEVICE_WEIGHTS.replaced(key))

    def hold_weights(self, model: ModelEntry, classes: Sequence[ClassConfig]) -> WeightsHold:
        """Take the model's device weights now, measured as the drop in free device memory."""
        plan, key = self.weights_plan(model, classes), weights_key(model, DEVICE)
        # An allocation and a synchronous copy: never while another lane captures a graph.
        with CAPTURE_GATE.shared():
            before = self.free_bytes()
            try:
                DEVICE_WEIGHTS.take(key, lambda: load_device_weights(self._ort, model.variant.path, DEVICE))
            except Exception as exc:
                raise load_failure(model.name, model.variant.path, exc) from exc
            added = max(0, before - self.free_bytes())
        return WeightsHold(replace(plan, added_bytes=added), lambda: _give_back(key))

    def open_ipc(self, handle: bytes, nbytes: int) -> cuda.IpcMemory:
        return open_ipc(handle, nbytes)

    def load(self, model: ModelEntry, lane: ClassConfig) -> OnnxRuntimeCudaRunner:
        runner = OnnxRuntimeCudaRunner(self._ort, model, lane, self.reservation_of(model, lane))
        if runner.cpu_nodes:  # only ever set to True: workers loading at once cannot undo each other
            self._cpu_nodes[model.name] = True
        return runner

    def describe(self, model: ModelEntry) -> dict[str, Any]:
        """`cpu_nodes` in the model's `models` entry: whether any of its nodes runs on the CPU,
        so that a figure measured on it is not taken for a GPU figure."""
        return {"cpu_nodes": self._cpu_nodes.get(model.name, False)}

    def reservation_of(self, model: ModelEntry, lane: ClassConfig) -> ModelReservation:
        plan = self._plans.get(lane.name)
        if plan is None:
            raise BackendError(f"lane {lane.name} was loaded before reserve() worked out its memory")
        return next(m for m in plan.models if m.model == model.name)


def _give_back(key: Key) -> None:
    """The loader's hold on a model's weights, given back (the last one frees the memory):
    on the loader's thread, never while a lane captures."""
    with CAPTURE_GATE.shared():
        DEVICE_WEIGHTS.give_back(key)


def open_ipc(handle: bytes, nbytes: int) -> cuda.IpcMemory:
    """A client's CUDA IPC region (edged.backends.OpeningIpc), opened on the calling thread,
    the socket loop's, in the device's primary context, which the lanes share."""
    try:
        cuda.set_device(DEVICE)
        with CAPTURE_GATE.shared():  # cudaIpcOpenMemHandle would break a capture in progress
            return cuda.IpcMemory(handle, nbytes)
    except cuda.CudaError as exc:
        raise BackendError(f"the daemon cannot open this CUDA IPC handle: {exc}") from None
