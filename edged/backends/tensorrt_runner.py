"""A TensorRT engine's execution context for one lane worker: on the lane's own priority
stream, with its own activation memory (`device_memory_size_v2`, allocated here and given
to the context) and preallocated buffers; with `cuda_graph`, a CUDA graph per input shape.
The engines it runs, and the backend that loads it: edged.backends.tensorrt.

Written against TensorRT 10/11's documented Python API and cuda-python; NOT YET RUN on a
GPU (no machine here has TensorRT's builder, see docs/engines.md): tested on fakes of
TensorRT and CUDA (tests/backends/test_gpu_fakes.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, cast

import numpy as np

from edged.backends import BackendError, DeviceTensor, cuda
from edged.backends.onnxruntime_cuda_runner import lane_stream
from edged.config.classes import ClassConfig
from edged.wire.signature import Signature


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
