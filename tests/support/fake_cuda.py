"""Fakes of what cannot exist here, for the GPU runners' life cycle: a `cuda` layer
(edged.backends.cuda), an `onnxruntime` with a CUDA provider, a TensorRT engine. Each records what was
asked of it, in order, in one shared list, so a test can check the order of calls.
Tests that use them say "fake" in their names; nothing here shows that a GPU works.
"""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from edged.backends import cuda_memory

PROVIDER = "CUDAExecutionProvider"


class FakeCuda(types.SimpleNamespace):
    """Stands in for edged.backends.cuda: streams, staged buffers and graphs that log."""

    def __init__(self, log: list[str], total_bytes: int = 1 << 40) -> None:
        super().__init__()
        self.log = log
        self.held: dict[int, int] = {}  # the live DeviceBuffers' sizes, by pointer
        self.next_pointer = 0x1000
        self.uploads: list[int] = []  # bytes of each upload_at_load
        self.copied: list[tuple[Any, Any, Any]] = []  # (stream, staged, input) of every call's inputs
        cuda = self

        class Stream:
            def __init__(self, priority: int = 0) -> None:
                self.priority, self.pointer = priority, 7
                log.append("stream.create")

            def synchronize(self) -> None:
                log.append("stream.synchronize")

            def wait_value32(self, device_pointer: int, value: int) -> None:
                log.append("stream.wait")

            def capture(self, enqueue: Callable[[], None]) -> Graph:
                log.append("capture.begin")
                try:
                    enqueue()
                finally:
                    log.append("capture.end")
                return Graph()

            def launch(self, graph: Any) -> None:
                log.append("graph.launch")

            def close(self) -> None:
                log.append("stream.close")

        class Graph:
            def close(self) -> None:
                log.append("graph.destroy")

        class DeviceBuffer:
            def __init__(self, nbytes: int) -> None:
                self.nbytes, self.pointer = nbytes, cuda.next_pointer
                cuda.next_pointer += max(nbytes, 1)
                cuda.held[self.pointer] = nbytes

            def close(self) -> None:
                if cuda.held.pop(self.pointer, None) is not None:
                    log.append("device.free")

        class Staged:
            def __init__(self, dtype: np.dtype[Any], nbytes: int) -> None:
                self.dtype, self.device = dtype, types.SimpleNamespace(pointer=100, nbytes=nbytes)

            def close(self) -> None:
                log.append("staged.close")

        self.Stream, self.Staged, self.Graph, self.DeviceBuffer = Stream, Staged, Graph, DeviceBuffer
        self.CudaError = RuntimeError
        self.Lender = cuda_memory.Lender  # no CUDA call in it: the real one
        self.set_device = lambda device: None
        self.download_now = lambda tensor: (log.append("download_now"), np.ones(tensor.shape, tensor.dtype))[1]
        self.cuda_available = lambda: None
        self.device_info = lambda device=0: types.SimpleNamespace(name="Fake GPU", compute_capability=(9, 0))
        # Free memory is what the live DeviceBuffers leave, so that what the code measures is theirs.
        self.memory_info = lambda: (total_bytes - sum(self.held.values()), total_bytes)

    def upload_at_load(self, device_pointer: int, arrays: list[tuple[int, np.ndarray]]) -> None:
        self.log.append("upload")
        self.uploads.append(sum(array.nbytes for _, array in arrays))

    def copy_run_keeping(
        self,
        stream: Any,
        inputs: list[tuple[Any, Any]],
        enqueue: Callable[[], None],
        outputs: Callable[[], list[tuple[Any, tuple[int, ...], Any]]],
    ) -> list[Any]:
        """Zeros for each downloaded output; one given a lender comes back lent, as the real one does."""
        self.copied.extend((stream, staged, value) for staged, value in inputs)
        enqueue()
        return [
            np.zeros(shape, staged.dtype) if lender is None else lender.lend(staged, shape)
            for staged, shape, lender in outputs()
        ]


class _Binding:
    def __init__(self, log: list[str]) -> None:
        self._log = log
        self.rows = 0

    def bind_input(self, name: str, device: str, device_id: int, dtype: Any, shape: list[int], pointer: int) -> None:
        self.rows = shape[0]

    def bind_output(self, *args: Any) -> None: ...

    def clear_binding_inputs(self) -> None:
        self._log.append("binding.clear_inputs")

    def clear_binding_outputs(self) -> None:
        self._log.append("binding.clear_outputs")

    def __del__(self) -> None:
        self._log.append("binding.freed")


class _Session:
    """Captures a graph id's CUDA graph on the run after `regular_runs` plain runs of it,
    as recent CUDA providers do (two)."""

    def __init__(self, ort: FakeOrt, placed: str) -> None:
        self._ort, self._placed = ort, placed
        ort.log.append("session.create")

    def get_providers(self) -> list[str]:
        return [self._placed, "CPUExecutionProvider"]

    def io_binding(self) -> _Binding:
        return _Binding(self._ort.log)

    def run_with_iobinding(self, binding: _Binding, options: Any) -> None:
        self._ort.rows_run.append(binding.rows)
        self._ort.threads.add(threading.get_ident())
        graph_id = options.entries.get("gpu_graph_id")
        if graph_id is not None:
            runs = self._ort.runs[graph_id] = self._ort.runs.get(graph_id, 0) + 1
            if runs == self._ort.regular_runs + 1:
                self._ort.log.append("ort.capture.begin")
                time.sleep(self._ort.capture_s)  # another thread's CUDA call now would break it
                self._ort.captured.add(graph_id)
                self._ort.log.append("ort.capture.end")
                return
        self._ort.log.append("ort.run")

    def __del__(self) -> None:
        self._ort.log.append("session.freed")


class _SessionOptions:
    def __init__(self) -> None:
        self.config: dict[str, str] = {}
        self.initializers: dict[str, Any] = {}

    def add_session_config_entry(self, key: str, value: str) -> None:
        self.config[key] = value

    def add_initializer(self, name: str, value: Any) -> None:
        self.initializers[name] = value


class _OrtValue:
    """What `OrtValue.from_dlpack` gives: the device pointer and shape it was handed."""

    def __init__(self, source: Any) -> None:
        tensor = source.managed.dl_tensor
        self.pointer, self.shape = int(tensor.data), tuple(source.shape[: tensor.ndim])
        self.device = source.__dlpack_device__()

    @classmethod
    def from_dlpack(cls, source: Any) -> _OrtValue:
        return cls(source)


class FakeOrt(types.ModuleType):
    """Stands in for onnxruntime(-gpu): its sessions land on `placed`. `provider_error`:
    creating the CUDA provider raises it, and, as ONNX Runtime's Python layer does unless
    told `enable_fallback=0`, the session is made again on the CPU. `cpu_nodes`: the model
    has nodes the CUDA provider leaves to the CPU, refused under
    `session.disable_cpu_ep_fallback`."""

    def __init__(
        self,
        log: list[str],
        placed: str = PROVIDER,
        regular_runs: int = 2,
        capture_s: float = 0,
        provider_error: str = "",
        cpu_nodes: bool = False,
    ) -> None:
        super().__init__("onnxruntime")
        self.log, self.placed, self.regular_runs, self.capture_s = log, placed, regular_runs, capture_s
        self.provider_error, self.cpu_nodes = provider_error, cpu_nodes
        self.runs: dict[str, int] = {}
        self.captured: set[str] = set()
        self.rows_run: list[int] = []  # the rows bound at each run, in order
        self.threads: set[int] = set()  # the threads that ran or captured
        self.sessions: list[dict[str, Any]] = []  # what each session was created with

        class RunOptions:
            def __init__(self) -> None:
                self.entries: dict[str, str] = {}
                self.terminate = False

            def add_run_config_entry(self, key: str, value: str) -> None:
                self.entries[key] = value

        self.RunOptions = RunOptions
        self.SessionOptions = _SessionOptions
        self.OrtValue = _OrtValue
        self.GraphOptimizationLevel = types.SimpleNamespace(ORT_ENABLE_ALL=99)

    def get_available_providers(self) -> list[str]:
        return [PROVIDER, "CPUExecutionProvider"]

    def preload_dlls(self) -> None:
        self.log.append("preload_dlls")

    def InferenceSession(self, path: str, options: Any, providers: Any, enable_fallback: int = 1) -> _Session:
        self.sessions.append({"options": options, "providers": providers, "enable_fallback": enable_fallback})
        if self.provider_error:
            if enable_fallback:
                print(f"EP Error {self.provider_error} when using {providers}")
                return _Session(self, "CPUExecutionProvider")
            raise RuntimeError(self.provider_error)
        if self.cpu_nodes and options.config.get("session.disable_cpu_ep_fallback") == "1":
            raise RuntimeError(
                "[ONNXRuntimeError] : 1 : FAIL : This session contains graph nodes that are assigned to the default "
                "CPU EP, but fallback to CPU EP has been explicitly disabled by the user."
            )
        return _Session(self, self.placed)


class _Context:
    """A TensorRT execution context for an engine with input x[N, 64] and output scores[N, 10]."""

    def __init__(self, trt: FakeTrt) -> None:
        self._trt, self._rows = trt, 0

    def set_device_memory(self, pointer: int, size: int) -> None: ...

    def set_optimization_profile_async(self, index: int, stream: int) -> bool:
        return not self._trt.fail == "profile"

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        if self._trt.fail == "shape" or not 1 <= shape[0] <= self._trt.profile_max:
            return False
        self._rows = shape[0]
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return (self._rows, 64 if name == "x" else 10)

    def set_tensor_address(self, name: str, pointer: int) -> None: ...

    def execute_async_v3(self, stream: int) -> bool:
        capturing = self._trt.log[-1] == "capture.begin"
        return not (self._trt.fail == "execute" or (capturing and self._trt.fail == "capture"))

    def __del__(self) -> None:
        self._trt.log.append("context.freed")


class _Logger:
    WARNING = 2

    def __init__(self, severity: int) -> None:
        self.severity = severity


class FakeTrt(types.SimpleNamespace):
    """Stands in for the tensorrt module and one engine (`engine`); `fail` names the call
    that reports failure: "profile", "shape", "execute" or "capture"."""

    __version__ = "10.9.0"

    def __init__(self, log: list[str], profile_max: int = 8, fail: str = "") -> None:
        super().__init__(log=log, profile_max=profile_max, fail=fail)
        self.Logger = _Logger
        self.Runtime = lambda logger: types.SimpleNamespace(deserialize_cuda_engine=self._deserialize)
        self.ExecutionContextAllocationStrategy = types.SimpleNamespace(USER_MANAGED=2)
        self.TensorIOMode = types.SimpleNamespace(INPUT=1, OUTPUT=2)
        self.nptype = lambda dtype: np.float32
        names = ["x", "scores"]
        self.engine = types.SimpleNamespace(
            device_memory_size_v2=1024,
            num_io_tensors=2,
            get_tensor_name=names.__getitem__,
            get_tensor_mode=lambda name: 1 if name == "x" else 2,
            get_tensor_dtype=lambda name: "float32",
            get_tensor_profile_shape=lambda name, profile: [(1, 64), (4, 64), (profile_max, 64)],
            create_execution_context=lambda strategy: _Context(self),
        )

    def _deserialize(self, data: bytes) -> Any:
        self.log.append("engine.deserialize")
        return self.engine
