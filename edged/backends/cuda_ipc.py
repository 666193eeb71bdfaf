"""A client's device memory, opened by its CUDA IPC handle (cudaIpcOpenMemHandle) and
closed (cudaIpcCloseMemHandle) once nothing references it: neither its region, nor a
request that reads it, nor a lane's call in flight. Python frees an object when its last
reference goes, as it unmaps an mmap, so the close needs no count of its own.

Written against cuda-python's documented runtime and driver APIs; ran once, on an NVIDIA
H200 (bench/gpu_checks.py ipc, docs/benchmarks-gpu.md).
"""

from __future__ import annotations

import ctypes
import weakref
from functools import partial

from edged.backends.capture_gate import CAPTURE_GATE
from edged.backends.cuda_calls import CudaError, check, check_driver, driver_api, runtime

IPC_HANDLE_BYTES = 64  # cudaIpcMemHandle_t: 64 opaque bytes


class IpcMemory:
    """Device memory another process exported, mapped into this one for as long as this
    object lives; `pointer` and `nbytes` are the span the client registered."""

    def __init__(self, handle: bytes, nbytes: int) -> None:
        if len(handle) != IPC_HANDLE_BYTES:
            raise CudaError(f"a CUDA IPC handle is {IPC_HANDLE_BYTES} bytes, not {len(handle)}")
        rt = runtime()
        raw = rt.cudaIpcMemHandle_t()
        # cuda-python gives the struct's memory, not its char[64] field: fill it in place.
        ctypes.memmove(raw.getPtr(), handle, IPC_HANDLE_BYTES)
        # Lazy peer access: memory on another GPU of the box is mapped if the two can peer.
        flags = rt.cudaIpcMemLazyEnablePeerAccess
        self.pointer = int(check("cudaIpcOpenMemHandle", rt.cudaIpcOpenMemHandle(raw, flags)))
        self.nbytes = nbytes
        # Not at exit: the driver unmaps what is left when the process ends. Never during a
        # capture, which it would break: CAPTURE_GATE runs it at once or when the capture ends.
        self._close = weakref.finalize(self, CAPTURE_GATE.outside_capture, partial(close_ipc, self.pointer))
        self._close.atexit = False
        try:
            available = allocation_bytes(self.pointer)
        except CudaError:
            self._close()
            raise
        if nbytes > available:
            self._close()
            raise CudaError(f"its allocation has {available} bytes, fewer than the {nbytes} registered")


def allocation_bytes(pointer: int) -> int:
    """How many bytes of its allocation lie from `pointer` on (cuMemGetAddressRange): a
    client's word for the size is never trusted, since a copy past the end would be an
    illegal address, an error that spoils the daemon's CUDA context for good."""
    driver = driver_api()
    base, size = check_driver("cuMemGetAddressRange", driver.cuMemGetAddressRange(driver.CUdeviceptr(pointer)))
    return int(base) + int(size) - pointer


def close_ipc(pointer: int) -> None:
    check("cudaIpcCloseMemHandle", runtime().cudaIpcCloseMemHandle(pointer))
