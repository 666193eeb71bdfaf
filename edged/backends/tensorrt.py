"""TensorRT engines on the GPU: one deserialized engine per model and precision in the
process (edged.backends.tensorrt_engines), its weights held and counted once, and one
execution context per lane worker, on its own priority stream, with its own activation
memory (`device_memory_size_v2`, allocated here and given to the context) and
preallocated buffers.

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
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any, cast

import numpy as np

from edged.backends import BackendError, DeviceMemory, DeviceTensor, Runner, cuda
from edged.backends.onnxruntime_cuda import lane_stream, open_ipc
from edged.backends.shared import Weights, WeightsHold, file_key
from edged.backends.tensorrt_engines import ENGINES, Chosen, deserialize
from edged.config.classes import ClassConfig
from edged.models.engines import Environment, select
from edged.models.repository import ModelEntry, sha256_of
from edged.models.warmup import load_failure
from edged.wire.signature import Signature

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


class TensorRtRunner:
    """One lane worker's context: stream, device memory and buffers, all made here, once,
    and given back by `close` (or by a constructor that fails) in the reverse order."""

    def __init__(
        self,
        trt: Any,
        engine: Any,
        signature: Signature,
        lane: ClassConfig,
        give_back: Callable[[], None] | None = None,
    ) -> None:
        """`give_back` hands the shared engine back once this context is destroyed."""
        cuda.set_device(0)
        self._engine = engine
        self._give_back = give_back
        self.activation_bytes = 0  # this context's own device memory, beside the shared engine
        self._signature = signature
        self._context: Any = None
        self._scratch: cuda.DeviceBuffer | None = None
        self._staged: dict[str, cuda.Staged] = {}
        self._graphs: dict[tuple[tuple[int, ...], ...], cuda.Graph] = {}
        self._capture = lane.cuda_graph
        self._lender = cuda.Lender()  # what `run_keeping` lent is read until the next enqueue
        self.stream = lane_stream(lane)
        try:
            self._set_up(trt, lane)
        except BaseException:
            self.close()
            raise

    def _set_up(self, trt: Any, lane: ClassConfig) -> None:
        engine = self._engine
        self._context = engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        # The engine's largest need over its profiles (one, as edged builds them): this context's activations.
        size = self.activation_bytes = engine.device_memory_size_v2
        self._scratch = cuda.DeviceBuffer(size)
        self._context.set_device_memory(self._scratch.pointer, size)
        if not self._context.set_optimization_profile_async(0, self.stream.pointer):
            raise BackendError("TensorRT refused optimization profile 0 for this context (see the TensorRT log)")
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self._inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in names if n not in self._inputs]
        dtypes = {n: np.dtype(trt.nptype(engine.get_tensor_dtype(n))) for n in names}
        # Buffers for max_batch rows (max_batch counts rows), so no call ever allocates.
        rows = lane.max_batch if self._signature.batchable else None
        for name in self._inputs:
            largest = tuple(engine.get_tensor_profile_shape(name, 0)[2])
            if rows is not None and largest[0] < rows:
                raise BackendError(
                    f"the engine's profile takes at most {largest[0]} rows of {name}, fewer than "
                    f"classes.{lane.name}.max_batch = {rows}: lower max_batch or rebuild the engine"
                )
            self._set_shape(name, largest if rows is None else (rows, *largest[1:]))
        for name in names:
            nbytes = int(np.prod(tuple(self._context.get_tensor_shape(name)))) * dtypes[name].itemsize
            self._staged[name] = cuda.Staged(dtypes[name], nbytes)
            self._context.set_tensor_address(name, self._staged[name].device.pointer)
        # Every batch size once (and its graph captured, if asked) before serving.
        for size in range(1, (rows or 1) + 1):
            self.run(self._signature.zeros(size), self._outputs)

    def _set_shape(self, name: str, shape: tuple[int, ...]) -> None:
        if not self._context.set_input_shape(name, shape):
            raise BackendError(f"TensorRT refused shape {list(shape)} for {name} (outside the engine's profile?)")

    def run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        return cast("list[np.ndarray]", self.run_keeping(inputs, output_names, ()))  # nothing kept

    def run_keeping(
        self,
        inputs: dict[str, np.ndarray | DeviceTensor],
        output_names: Sequence[str],
        keep: Collection[str],
    ) -> list[np.ndarray | DeviceTensor]:
        """edged.backends.KeepsOnDevice: a kept output is lent from its own buffer, the
        address the context writes it to."""
        for name in self._inputs:
            self._set_shape(name, inputs[name].shape)
        key = tuple(inputs[name].shape for name in self._inputs)
        lenders = [self._lender if name in keep else None for name in output_names]
        return cuda.copy_run_keeping(
            self.stream,
            [(self._staged[name], inputs[name]) for name in self._inputs],
            lambda: self._enqueue(key),
            lambda: [
                (self._staged[name], tuple(self._context.get_tensor_shape(name)), lender)
                for name, lender in zip(output_names, lenders)
            ],
        )

    def _enqueue(self, key: tuple[tuple[int, ...], ...]) -> None:
        # After the inputs' copies, which may read what this runner lent last: the run overwrites it.
        self._lender.ran()
        graph = self._graphs.get(key)
        if graph is not None:
            self.stream.launch(graph)
            return
        self._execute()
        if self._capture:
            # During warm-up, after a plain enqueue has flushed TensorRT's deferred set-up for these shapes.
            self._graphs[key] = self.stream.capture(self._execute)

    def _execute(self) -> None:
        if not self._context.execute_async_v3(self.stream.pointer):
            raise BackendError("TensorRT execute_async_v3 failed (see the TensorRT log)")

    def close(self) -> None:
        """Wait for the stream, then free what uses the rest first: graphs, the context,
        its device memory, the buffers, the stream."""
        self._lender.ran()  # what it lent is freed below
        self.stream.synchronize()
        for graph in self._graphs.values():
            graph.close()
        self._graphs.clear()
        self._context = None  # the last reference: TensorRT destroys the context here
        self._engine = None
        if self._give_back is not None:
            self._give_back()  # after the context, which uses the engine
            self._give_back = None
        if self._scratch is not None:
            self._scratch.close()
            self._scratch = None
        for staged in self._staged.values():
            staged.close()
        self._staged.clear()
        self.stream.close()
