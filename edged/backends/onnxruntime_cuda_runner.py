"""ONNX Runtime on its CUDA provider: a lane worker's session of one model, on the lane's own stream.

Per worker and model, at load (never per request):
- a CUDA stream created with the class's `stream_priority`, handed to the session as
  its compute stream (`user_compute_stream`), so what the session launches is ordered
  on the lane's stream alone; the priority ranks the lane's kernels waiting to start
  against other lanes' (never a kernel already running, and never a copy: stream
  priorities do not apply to memory copies);
- `gpu_mem_limit`: the lane's `arena_cap_mb` split between its sessions;
- device buffers for every input and output at the class's largest batch, bound
  with I/O binding, and pinned host buffers to stage them;
- a run at every batch size up to the class's largest, so cuDNN's algorithm search
  and the arena's growth happen here; with `cuda_graph = true`, one CUDA graph per
  batch size (ONNX Runtime's `gpu_graph_id` run option), each captured here (see
  CAPTURE_RUNS), alone in the process (edged.backends.capture_gate).
The session itself: edged.backends.onnxruntime_gpu; the backend that plans the lanes'
memory and loads these: edged.backends.onnxruntime_cuda.

Written against ONNX Runtime's and cuda-python's documented APIs; ran on an NVIDIA H200
and an H100 (docs/benchmarks-gpu.md).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, cast

import numpy as np

from edged.backends import BackendError, DeviceTensor, cuda, green
from edged.backends.capture_gate import CAPTURE_GATE
from edged.backends.device_weights import DEVICE_WEIGHTS, load_device_weights, weights_key
from edged.backends.gpu_memory import ModelReservation, fixed_shape
from edged.backends.onnxruntime_gpu import create_session
from edged.backends.shared import Key
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry
from edged.wire.codec import DTYPES

# One daemon owns one GPU: edged@N sets CUDA_VISIBLE_DEVICES=N, so it is device 0 here.
DEVICE = 0
# The CUDA provider captures a graph id's graph on the run after its first regular
# runs of it (two in recent releases, one in older ones): warm-up runs each batch size
# this many times, so the capture happens at load whichever release is installed.
CAPTURE_RUNS = 3


class OnnxRuntimeCudaRunner:
    def __init__(
        self,
        ort: Any,
        model: ModelEntry,
        lane: ClassConfig,
        reservation: ModelReservation,
        stream: cuda.Stream | None = None,
    ) -> None:
        """With `stream`, the session runs on that stream, which the caller owns (the GPU
        benchmark's one-stream ablation); without, on a stream of its own at the lane's priority."""
        cuda.set_device(DEVICE)  # the current device is per thread: this is the worker's
        self._signature = model.signature
        self._max_rows = lane.max_batch if self._signature.batchable else 1
        self._specs = {spec.name: spec for spec in model.signature.inputs + model.signature.outputs}
        self._staged: dict[str, cuda.Staged] = {}
        self._bound_rows = 0
        self._session: Any = None
        self._binding: Any = None
        self._run_options: dict[int, Any] = {}
        self._weights: Key | None = None  # the model's device weights this runner holds (device_weights)
        self.cpu_nodes = False  # some nodes run on the CPU (onnxruntime_gpu.create_session)
        self._owns_stream = stream is None
        self.stream = stream
        self._lender = cuda.Lender()  # what `run_keeping` lent is read until the next run
        try:
            with CAPTURE_GATE.shared():
                if self.stream is None:
                    self.stream = lane_stream(lane)
                self._create(ort, model, lane, reservation)
            for rows in range(1, self._max_rows + 1):
                # Every batch size once at load, so that no request pays for cuDNN's exhaustive
                # algorithm search at its shape or for the arena's growth, and the lane's measured
                # memory counts both; with cuda_graph, each size's graph is captured here.
                if lane.cuda_graph:
                    with CAPTURE_GATE.exclusive():  # one size at a time: other lanes serve in between
                        for _ in range(CAPTURE_RUNS):
                            self._run(self._signature.zeros(rows), self._outputs)
                else:
                    self.run(self._signature.zeros(rows), self._outputs)
        except BaseException:
            self.close()
            raise

    def _create(self, ort: Any, model: ModelEntry, lane: ClassConfig, reservation: ModelReservation) -> None:
        """The model's shared weights, the session, its buffers and binding, and a run option per batch size."""
        key = weights_key(model, DEVICE)
        weights = DEVICE_WEIGHTS.take(key, lambda: load_device_weights(ort, model.variant.path, DEVICE))
        self._weights = key
        provider = self._provider(lane, reservation)
        created = create_session(ort, model.variant.path, model.name, lane, provider, weights.values)
        self._session, self.cpu_nodes = created.session, created.cpu_nodes
        for spec in self._specs.values():
            nbytes = int(np.prod(fixed_shape(model, spec, self._max_rows), dtype=np.int64))
            self._staged[spec.name] = cuda.Staged(DTYPES[spec.dtype], nbytes * DTYPES[spec.dtype].itemsize)
        self._inputs = [spec.name for spec in model.signature.inputs]
        self._outputs = [spec.name for spec in model.signature.outputs]
        self._binding = self._session.io_binding()
        for rows in range(1, self._max_rows + 1):
            self._run_options[rows] = ort.RunOptions()
            if lane.cuda_graph:
                # 0 is reserved by ONNX Runtime; one graph per batch size, each id >= 1.
                self._run_options[rows].add_run_config_entry("gpu_graph_id", str(rows))

    @property
    def providers(self) -> list[str]:
        return self._session.get_providers()

    def run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        return cast("list[np.ndarray]", self.run_keeping(inputs, output_names, ()))  # nothing kept

    def run_keeping(
        self,
        inputs: dict[str, np.ndarray | DeviceTensor],
        output_names: Sequence[str],
        keep: Collection[str],
    ) -> list[np.ndarray | DeviceTensor]:
        """edged.backends.KeepsOnDevice: a kept output is lent from its own buffer, the
        address its I/O binding binds the output to."""
        CAPTURE_GATE.enter()
        try:
            return self._run(inputs, output_names, keep)
        finally:
            CAPTURE_GATE.leave()

    def _run(
        self,
        inputs: dict[str, np.ndarray | DeviceTensor],
        output_names: Sequence[str],
        keep: Collection[str] = (),
    ) -> list[np.ndarray | DeviceTensor]:
        rows = self._signature.rows(inputs)  # a DeviceTensor has a shape too
        if rows > self._max_rows:
            raise BackendError(f"{rows} rows exceed the {self._max_rows} this lane's buffers hold")
        if rows != self._bound_rows:
            self._bind(rows)
        options = self._run_options[rows]
        return cuda.copy_run_keeping(
            self.stream,
            [(self._staged[name], array) for name, array in inputs.items()],
            # Enqueued on the lane's stream behind the copies; ONNX Runtime waits for it at the end.
            lambda: self._enqueue(options),
            lambda: [
                (self._staged[name], self._shape(name, rows), self._lender if name in keep else None)
                for name in output_names
            ],
        )

    def _enqueue(self, options: Any) -> None:
        # After the inputs' copies, which may read what this runner lent last: the run overwrites it.
        self._lender.ran()
        self._session.run_with_iobinding(self._binding, options)

    def close(self) -> None:
        """Free in the reverse order of use: the session (and its CUDA graphs) launches work
        on the stream into the buffers, and the binding holds a reference to the session."""
        with CAPTURE_GATE.shared():
            self._free()

    def _free(self) -> None:
        self._lender.ran()  # what it lent is freed below
        if self._binding is not None:
            self._binding.clear_binding_inputs()
            self._binding.clear_binding_outputs()
        self._binding = None
        self._run_options.clear()
        self._session = None  # its last reference: ONNX Runtime frees it, graphs included, here
        if self._weights is not None:
            DEVICE_WEIGHTS.give_back(self._weights)  # after the session, which points into them
            self._weights = None
        for staged in self._staged.values():
            staged.close()
        self._staged.clear()
        if self._owns_stream and self.stream is not None:
            self.stream.close()

    # --- load-time steps -------------------------------------------------------

    def _provider(self, lane: ClassConfig, reservation: ModelReservation) -> dict[str, str]:
        options = {
            "device_id": str(DEVICE),
            "has_user_compute_stream": "1",
            "user_compute_stream": str(self.stream.pointer),
            # Copies on the compute stream too, so they stay in order with the lane's kernels (without its priority).
            "do_copy_in_default_stream": "1",
            "enable_cuda_graph": "1" if lane.cuda_graph else "0",
            # The provider's default, said here: the fastest algorithm per shape, searched at
            # load, since warm-up runs every batch size (heuristic search would pick faster, worse).
            "cudnn_conv_algo_search": "EXHAUSTIVE",
        }
        if reservation.arena_limit_bytes:
            options["gpu_mem_limit"] = str(reservation.arena_limit_bytes)
        return options

    def _shape(self, name: str, rows: int) -> tuple[int, ...]:
        return self._signature.shape_at(self._specs[name], rows)

    def _bind(self, rows: int) -> None:
        """Point the binding at the same buffers with `rows` rows (a CUDA graph needs fixed addresses)."""
        for name in self._inputs:
            staged = self._staged[name]
            shape = list(self._shape(name, rows))
            self._binding.bind_input(name, "cuda", DEVICE, staged.dtype, shape, staged.device.pointer)
        for name in self._outputs:
            staged = self._staged[name]
            shape = list(self._shape(name, rows))
            self._binding.bind_output(name, "cuda", DEVICE, staged.dtype, shape, staged.device.pointer)
        self._bound_rows = rows


def lane_stream(lane: ClassConfig) -> cuda.Stream:
    """The lane's compute stream: a green context's of `sm_count` SMs where the class
    asks for one (edged.backends.green), else a plain one; at the class's priority."""
    if lane.sm_count:
        return green.green_stream(lane.sm_count, lane.stream_priority)
    return cuda.Stream(lane.stream_priority)
