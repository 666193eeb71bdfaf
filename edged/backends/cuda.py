"""CUDA through cuda-python (`cuda.bindings.runtime`): a thin, checked layer.

Every call's status is checked and a failure becomes a CudaError naming the call
and CUDA's own error string. cuda-python is imported lazily, so the CPU daemon
never needs it. Written against cuda-python's documented runtime API; not yet
run on a GPU (see the README's CUDA section).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger("edged.cuda")

INSTALL_HINT = "install with pip install -e '.[gpu]'"


class CudaError(RuntimeError):
    """A CUDA call that failed; the message names the call and CUDA's error."""


def _runtime() -> Any:
    try:
        from cuda.bindings import runtime
    except ImportError:
        raise CudaError(f"cuda-python (cuda.bindings) is not installed: {INSTALL_HINT}") from None
    return runtime


def _check(call: str, result: tuple[Any, ...]) -> Any:
    """Unpack a cuda-python runtime result tuple (status, *values), raising on a failed status."""
    rt = _runtime()
    return _unpack(
        call, result, rt.cudaError_t.cudaSuccess, lambda s: (rt.cudaGetErrorName(s), rt.cudaGetErrorString(s))
    )


def _driver() -> Any:
    """cuda-python's driver API (`cuda.bindings.driver`), for what the runtime API lacks
    (green contexts, stream memory operations); it runs in the runtime's primary context."""
    try:
        from cuda.bindings import driver
    except ImportError:
        raise CudaError(f"cuda-python (cuda.bindings) is not installed: {INSTALL_HINT}") from None
    return driver


def _check_driver(call: str, result: tuple[Any, ...]) -> Any:
    """Unpack a driver API result tuple (status, *values) as `_check` does a runtime one."""
    driver = _driver()
    return _unpack(
        call, result, driver.CUresult.CUDA_SUCCESS, lambda s: (driver.cuGetErrorName(s), driver.cuGetErrorString(s))
    )


def _unpack(call: str, result: tuple[Any, ...], success: Any, explain: Callable[[Any], tuple[Any, Any]]) -> Any:
    """The values of a (status, *values) result, or CudaError naming the call and CUDA's
    error; `explain(status)` gives the error's name and text results, asked only on failure."""
    status, *values = result
    if status != success:
        (_, name), (_, text) = explain(status)
        raise CudaError(f"{call} failed: {_text(name, status)}: {_text(text, status)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _text(value: Any, status: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or status)


def cuda_available() -> str | None:
    """Why CUDA cannot be used here, or None when a device answers.

    Asks only the CUDA runtime for a device count: TensorRT and ONNX Runtime's CUDA
    objects can crash the process where there is no device (see docs), so callers
    check this before creating any of them.
    """
    try:
        _runtime()
    except CudaError as exc:
        return str(exc)
    try:
        count = device_count()
    except CudaError as exc:
        return f"no usable CUDA device: {exc}"
    return None if count > 0 else "no CUDA device: cudaGetDeviceCount found none"


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    index: int
    name: str
    total_bytes: int
    compute_capability: tuple[int, int]


def device_count() -> int:
    return _check("cudaGetDeviceCount", _runtime().cudaGetDeviceCount())


def device_info(device: int = 0) -> DeviceInfo:
    props = _check("cudaGetDeviceProperties", _runtime().cudaGetDeviceProperties(device))
    name = props.name.split(b"\0", 1)[0].decode() if isinstance(props.name, bytes) else str(props.name)
    return DeviceInfo(device, name, int(props.totalGlobalMem), (int(props.major), int(props.minor)))


def set_device(device: int) -> None:
    """Make `device` current on the calling thread (each lane worker calls it once)."""
    _check("cudaSetDevice", _runtime().cudaSetDevice(device))


def memory_info() -> tuple[int, int]:
    """(free, total) bytes on the current device."""
    free, total = _check("cudaMemGetInfo", _runtime().cudaMemGetInfo())
    return int(free), int(total)


def priority_range() -> tuple[int, int]:
    """(most urgent, least urgent) stream priorities of the current device, e.g. (-5, 0)."""
    least, greatest = _check("cudaDeviceGetStreamPriorityRange", _runtime().cudaDeviceGetStreamPriorityRange())
    return int(greatest), int(least)


def clamp_priority(asked: int, most_urgent: int, least_urgent: int) -> int:
    """The priority CUDA will actually use: it clamps silently, so we say so in the log."""
    return min(max(asked, most_urgent), least_urgent)


class Stream:
    """A non-blocking stream with a priority (it never waits on the legacy default stream).

    The priority ranks this stream's kernels waiting to start against other streams';
    it preempts no kernel already running and does not apply to memory copies."""

    def __init__(self, priority: int = 0) -> None:
        rt = _runtime()
        most, least = priority_range()
        self.priority = clamp_priority(priority, most, least)
        if self.priority != priority:
            log.warning(
                "stream priority %d is outside the device's range [%d, %d]: using %d",
                priority,
                most,
                least,
                self.priority,
            )
        self.handle = _check(
            "cudaStreamCreateWithPriority", rt.cudaStreamCreateWithPriority(rt.cudaStreamNonBlocking, self.priority)
        )
        self._release: Callable[[], None] | None = None

    @classmethod
    def adopt(cls, handle: Any, priority: int, release: Callable[[], None]) -> Stream:
        """A stream made elsewhere (a green context's, edged.backends.green); `release`
        runs after the stream is destroyed."""
        stream = cls.__new__(cls)
        stream.handle, stream.priority, stream._release = handle, priority, release
        return stream

    @property
    def pointer(self) -> int:
        """The cudaStream_t as an integer, as ONNX Runtime's user_compute_stream wants it."""
        return int(self.handle)

    def device_priority(self) -> int:
        """The priority CUDA reports for this stream (cudaStreamGetPriority)."""
        return int(_check("cudaStreamGetPriority", _runtime().cudaStreamGetPriority(self.handle)))

    def copy_to_device(self, device_ptr: int, host_ptr: int, nbytes: int) -> None:
        rt = _runtime()
        kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        _check("cudaMemcpyAsync", rt.cudaMemcpyAsync(device_ptr, host_ptr, nbytes, kind, self.handle))

    def copy_to_host(self, host_ptr: int, device_ptr: int, nbytes: int) -> None:
        rt = _runtime()
        kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        _check("cudaMemcpyAsync", rt.cudaMemcpyAsync(host_ptr, device_ptr, nbytes, kind, self.handle))

    def synchronize(self) -> None:
        _check("cudaStreamSynchronize", _runtime().cudaStreamSynchronize(self.handle))

    def wait_value32(self, device_pointer: int, value: int) -> None:
        """Hold everything enqueued on this stream after this call until the 32-bit word at
        `device_pointer` is at least `value` (cuStreamWaitValue32, CU_STREAM_WAIT_VALUE_GEQ):
        for checks that prove work ran on this stream (bench/gpu_checks.py), never for serving.
        The word is typically mapped pinned host memory, set from the host to release."""
        driver = _driver()
        geq = int(driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
        _check_driver(
            "cuStreamWaitValue32",
            driver.cuStreamWaitValue32(self.handle, driver.CUdeviceptr(device_pointer), value, geq),
        )

    def capture(self, enqueue: Callable[[], None]) -> Graph:
        """What `enqueue` puts on this stream, captured into an instantiated CUDA graph.
        The stream leaves capture mode whether or not `enqueue` raises."""
        rt = _runtime()
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        _check("cudaStreamBeginCapture", rt.cudaStreamBeginCapture(self.handle, mode))
        try:
            enqueue()
        except BaseException:
            # Leave capture mode, so the stream serves again; what was captured is discarded.
            status, graph = rt.cudaStreamEndCapture(self.handle)
            if status == rt.cudaError_t.cudaSuccess and graph:
                rt.cudaGraphDestroy(graph)
            raise
        graph = _check("cudaStreamEndCapture", rt.cudaStreamEndCapture(self.handle))
        try:
            return Graph(_check("cudaGraphInstantiate", rt.cudaGraphInstantiate(graph, 0)))
        finally:
            # The executable graph is independent of the captured one, which is freed here.
            _check("cudaGraphDestroy", rt.cudaGraphDestroy(graph))

    def launch(self, graph: Graph) -> None:
        """Launch a graph that `capture` made."""
        _check("cudaGraphLaunch", _runtime().cudaGraphLaunch(graph.handle, self.handle))

    def close(self) -> None:
        if self.handle is not None:
            _check("cudaStreamDestroy", _runtime().cudaStreamDestroy(self.handle))
            self.handle = None
            if self._release is not None:
                self._release()


class Graph:
    """An instantiated CUDA graph (cudaGraphExec_t), made by Stream.capture."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def close(self) -> None:
        if self.handle is not None:
            _check("cudaGraphExecDestroy", _runtime().cudaGraphExecDestroy(self.handle))
            self.handle = None


class Event:
    """A timing event: record on a stream, wait for it, read the time between two."""

    def __init__(self) -> None:
        rt = _runtime()
        self.handle = _check("cudaEventCreateWithFlags", rt.cudaEventCreateWithFlags(rt.cudaEventDefault))

    def record(self, stream: Stream) -> None:
        _check("cudaEventRecord", _runtime().cudaEventRecord(self.handle, stream.handle))

    def synchronize(self) -> None:
        _check("cudaEventSynchronize", _runtime().cudaEventSynchronize(self.handle))

    def elapsed_ms_since(self, start: Event) -> float:
        return float(_check("cudaEventElapsedTime", _runtime().cudaEventElapsedTime(start.handle, self.handle)))

    def close(self) -> None:
        if self.handle is not None:
            _check("cudaEventDestroy", _runtime().cudaEventDestroy(self.handle))
            self.handle = None


class DeviceBuffer:
    """cudaMalloc'd memory, allocated once at load and reused by every call."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.pointer = int(_check("cudaMalloc", _runtime().cudaMalloc(max(nbytes, 1))))

    def close(self) -> None:
        if self.pointer:
            _check("cudaFree", _runtime().cudaFree(self.pointer))
            self.pointer = 0


class PinnedBuffer:
    """Page-locked host memory (cudaMallocHost): asynchronous copies need it, and it is
    allocated once because pinning is slow."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.pointer = int(_check("cudaMallocHost", _runtime().cudaMallocHost(max(nbytes, 1))))

    def array(self, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
        """A numpy view of the first bytes of the buffer, without copying."""
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count * np.dtype(dtype).itemsize
        if nbytes > self.nbytes:
            raise CudaError(f"a {shape} {np.dtype(dtype)} view needs {nbytes} bytes; the buffer has {self.nbytes}")
        raw = (ctypes.c_byte * nbytes).from_address(self.pointer)
        return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)

    def close(self) -> None:
        if self.pointer:
            _check("cudaFreeHost", _runtime().cudaFreeHost(self.pointer))
            self.pointer = 0


class Staged:
    """One tensor's device buffer and the pinned host buffer its copies go through."""

    def __init__(self, dtype: np.dtype[Any], nbytes: int) -> None:
        self.dtype = dtype
        self.device = DeviceBuffer(nbytes)
        try:
            self.pinned = PinnedBuffer(nbytes)
        except BaseException:
            self.device.close()
            raise

    def upload(self, stream: Stream, array: np.ndarray) -> None:
        staged = self.pinned.array(self.dtype, array.shape)
        np.copyto(staged, array, casting="same_kind")
        stream.copy_to_device(self.device.pointer, self.pinned.pointer, staged.nbytes)

    def download(self, stream: Stream, shape: tuple[int, ...]) -> np.ndarray:
        """A view of the pinned buffer that holds `shape` once the stream is synchronized."""
        view = self.pinned.array(self.dtype, shape)
        stream.copy_to_host(self.pinned.pointer, self.device.pointer, view.nbytes)
        return view

    def close(self) -> None:
        self.device.close()
        self.pinned.close()


def copy_run_sync(
    stream: Stream,
    inputs: list[tuple[Staged, np.ndarray]],
    enqueue: Callable[[], None],
    outputs: Callable[[], list[tuple[Staged, tuple[int, ...]]]],
) -> list[np.ndarray]:
    """One call on `stream`: stage the inputs to the device, enqueue the run, stage the
    outputs (`outputs()` gives their shapes once the run is enqueued) back, and wait."""
    for staged, array in inputs:
        staged.upload(stream, array)
    enqueue()
    views = [staged.download(stream, shape) for staged, shape in outputs()]
    stream.synchronize()
    # Copies: the pinned buffers are reused by the next call while the reply may still be queued.
    return [view.copy() for view in views]
