"""CUDA through cuda-python (`cuda.bindings.runtime`): a thin, checked layer.

Every call's status is checked and a failure becomes a CudaError naming the call
and CUDA's own error string. cuda-python is imported lazily, so the CPU daemon
never needs it. Written against cuda-python's documented runtime API; not yet
run on a GPU (see docs/gpu.md, "The CUDA backend").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edged.backends.cuda_calls import INSTALL_HINT, CudaError, check, check_driver, driver_api, runtime
from edged.backends.cuda_ipc import IpcMemory
from edged.backends.cuda_memory import (
    DeviceBuffer,
    Lender,
    Lent,
    PinnedBuffer,
    Staged,
    copy_run_keeping,
    download_now,
    upload_at_load,
)

# What the backends reach through this module (`cuda.DeviceBuffer`, ...): one name to
# fake in tests, one to read in the code.
__all__ = [
    "INSTALL_HINT",
    "CudaError",
    "DeviceBuffer",
    "DeviceInfo",
    "Graph",
    "IpcMemory",
    "Lender",
    "Lent",
    "PinnedBuffer",
    "Staged",
    "Stream",
    "copy_run_keeping",
    "cuda_available",
    "device_count",
    "device_info",
    "download_now",
    "memory_info",
    "priority_range",
    "set_device",
    "upload_at_load",
]

log = logging.getLogger("edged.cuda")


def cuda_available() -> str | None:
    """Why CUDA cannot be used here, or None when a device answers.

    Asks only the CUDA runtime for a device count: TensorRT and ONNX Runtime's CUDA
    objects can crash the process where there is no device (see docs), so callers
    check this before creating any of them.
    """
    try:
        runtime()
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
    return check("cudaGetDeviceCount", runtime().cudaGetDeviceCount())


def device_info(device: int = 0) -> DeviceInfo:
    props = check("cudaGetDeviceProperties", runtime().cudaGetDeviceProperties(device))
    name = props.name.split(b"\0", 1)[0].decode() if isinstance(props.name, bytes) else str(props.name)
    return DeviceInfo(device, name, int(props.totalGlobalMem), (int(props.major), int(props.minor)))


def set_device(device: int) -> None:
    """Make `device` current on the calling thread (each lane worker calls it once)."""
    check("cudaSetDevice", runtime().cudaSetDevice(device))


def memory_info() -> tuple[int, int]:
    """(free, total) bytes on the current device."""
    free, total = check("cudaMemGetInfo", runtime().cudaMemGetInfo())
    return int(free), int(total)


def priority_range() -> tuple[int, int]:
    """(most urgent, least urgent) stream priorities of the current device, e.g. (-5, 0)."""
    least, greatest = check("cudaDeviceGetStreamPriorityRange", runtime().cudaDeviceGetStreamPriorityRange())
    return int(greatest), int(least)


def clamp_priority(asked: int, most_urgent: int, least_urgent: int) -> int:
    """The priority CUDA will actually use: it clamps silently, so we say so in the log."""
    return min(max(asked, most_urgent), least_urgent)


class Stream:
    """A non-blocking stream with a priority (it never waits on the legacy default stream).

    The priority ranks this stream's kernels waiting to start against other streams';
    it preempts no kernel already running and does not apply to memory copies."""

    def __init__(self, priority: int = 0) -> None:
        rt = runtime()
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
        self.handle = check(
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
        return int(check("cudaStreamGetPriority", runtime().cudaStreamGetPriority(self.handle)))

    def copy_to_device(self, device_ptr: int, host_ptr: int, nbytes: int) -> None:
        rt = runtime()
        kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        check("cudaMemcpyAsync", rt.cudaMemcpyAsync(device_ptr, host_ptr, nbytes, kind, self.handle))

    def copy_to_host(self, host_ptr: int, device_ptr: int, nbytes: int) -> None:
        rt = runtime()
        kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        check("cudaMemcpyAsync", rt.cudaMemcpyAsync(host_ptr, device_ptr, nbytes, kind, self.handle))

    def copy_on_device(self, destination: int, source: int, nbytes: int) -> None:
        """A device-to-device copy on this stream: a client's device input into a staging buffer."""
        rt = runtime()
        kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        check("cudaMemcpyAsync", rt.cudaMemcpyAsync(destination, source, nbytes, kind, self.handle))

    def synchronize(self) -> None:
        check("cudaStreamSynchronize", runtime().cudaStreamSynchronize(self.handle))

    def wait_value32(self, device_pointer: int, value: int) -> None:
        """Hold everything enqueued on this stream after this call until the 32-bit word at
        `device_pointer` is at least `value` (cuStreamWaitValue32, CU_STREAM_WAIT_VALUE_GEQ):
        for checks that prove work ran on this stream (bench/gpu_checks.py), never for serving.
        The word is typically mapped pinned host memory, set from the host to release."""
        driver = driver_api()
        geq = int(driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
        check_driver(
            "cuStreamWaitValue32",
            driver.cuStreamWaitValue32(self.handle, driver.CUdeviceptr(device_pointer), value, geq),
        )

    def capture(self, enqueue: Callable[[], None]) -> Graph:
        """What `enqueue` puts on this stream, captured into an instantiated CUDA graph.
        The stream leaves capture mode whether or not `enqueue` raises."""
        rt = runtime()
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        check("cudaStreamBeginCapture", rt.cudaStreamBeginCapture(self.handle, mode))
        try:
            enqueue()
        except BaseException:
            # Leave capture mode, so the stream serves again; what was captured is discarded.
            status, graph = rt.cudaStreamEndCapture(self.handle)
            if status == rt.cudaError_t.cudaSuccess and graph:
                rt.cudaGraphDestroy(graph)
            raise
        graph = check("cudaStreamEndCapture", rt.cudaStreamEndCapture(self.handle))
        try:
            return Graph(check("cudaGraphInstantiate", rt.cudaGraphInstantiate(graph, 0)))
        finally:
            # The executable graph is independent of the captured one, which is freed here.
            check("cudaGraphDestroy", rt.cudaGraphDestroy(graph))

    def launch(self, graph: Graph) -> None:
        """Launch a graph that `capture` made."""
        check("cudaGraphLaunch", runtime().cudaGraphLaunch(graph.handle, self.handle))

    def close(self) -> None:
        if self.handle is not None:
            check("cudaStreamDestroy", runtime().cudaStreamDestroy(self.handle))
            self.handle = None
            if self._release is not None:
                self._release()


class Graph:
    """An instantiated CUDA graph (cudaGraphExec_t), made by Stream.capture."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def close(self) -> None:
        if self.handle is not None:
            check("cudaGraphExecDestroy", runtime().cudaGraphExecDestroy(self.handle))
            self.handle = None
