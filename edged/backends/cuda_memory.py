"""CUDA memory and timing through cuda-python: events, device and pinned host buffers,
a tensor's staging between them, and a run's copies in and out on one stream."""

from __future__ import annotations

import contextlib
import ctypes
from typing import TYPE_CHECKING, Any

import numpy as np

from edged.backends.cuda_calls import CudaError, check, runtime

if TYPE_CHECKING:
    from collections.abc import Callable

    from edged.backends import DeviceTensor
    from edged.backends.cuda import Stream


class DeviceBuffer:
    """cudaMalloc'd memory, allocated once at load and reused by every call."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.pointer = int(check("cudaMalloc", runtime().cudaMalloc(max(nbytes, 1))))

    def close(self) -> None:
        if self.pointer:
            check("cudaFree", runtime().cudaFree(self.pointer))
            self.pointer = 0


def upload_at_load(device_pointer: int, arrays: list[tuple[int, np.ndarray]]) -> None:
    """Copy each (offset, array) to `device_pointer` + offset, and wait for the whole device:
    at load only, since the lanes' non-blocking streams do not wait for the default stream."""
    rt = runtime()
    kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
    for offset, array in arrays:
        check("cudaMemcpy", rt.cudaMemcpy(device_pointer + offset, array.ctypes.data, array.nbytes, kind))
    check("cudaDeviceSynchronize", rt.cudaDeviceSynchronize())


def download_now(tensor: DeviceTensor) -> np.ndarray:
    """A device input's bytes in a new host array, copied now (for a runner on the CPU)."""
    array = np.empty(tensor.shape, tensor.dtype)
    rt = runtime()
    kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
    check("cudaMemcpy", rt.cudaMemcpy(array.ctypes.data, tensor.pointer, tensor.nbytes, kind))
    return array


class PinnedBuffer:
    """Page-locked host memory (cudaMallocHost): asynchronous copies need it, and it is
    allocated once because pinning is slow."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.pointer = int(check("cudaMallocHost", runtime().cudaMallocHost(max(nbytes, 1))))

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
            check("cudaFreeHost", runtime().cudaFreeHost(self.pointer))
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

    def copy_from_device(self, stream: Stream, tensor: DeviceTensor) -> None:
        """Copy a client's device input into the device buffer on `stream`: no host round
        trip. Its bytes are taken as they are, so its dtype must be the buffer's."""
        if tensor.dtype != self.dtype or tensor.nbytes > self.device.nbytes:
            raise CudaError(
                f"a {tensor.nbytes}-byte {tensor.dtype} device input does not fit this {self.device.nbytes}-byte "
                f"{self.dtype} buffer: device inputs are copied as they are, never converted"
            )
        stream.copy_on_device(self.device.pointer, tensor.pointer, tensor.nbytes)

    def download(self, stream: Stream, shape: tuple[int, ...]) -> np.ndarray:
        """A view of the pinned buffer that holds `shape` once the stream is synchronized."""
        view = self.pinned.array(self.dtype, shape)
        stream.copy_to_host(self.pinned.pointer, self.device.pointer, view.nbytes)
        return view

    def close(self) -> None:
        self.device.close()
        self.pinned.close()


class Lender:
    """A runner's count of its runs: a buffer it lent out (`Lent`) may be read until the
    next run, which overwrites it, or until the runner closes (`ran` at both)."""

    __slots__ = ("runs",)

    def __init__(self) -> None:
        self.runs = 0

    def ran(self) -> None:
        self.runs += 1

    def lend(self, staged: Staged, shape: tuple[int, ...]) -> DeviceTensor:
        """`shape`'s first bytes of `staged`'s device buffer, as an input for another runner."""
        from edged.backends import DeviceTensor

        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(staged.dtype).itemsize
        return DeviceTensor(Lent(staged.device, self), 0, nbytes, np.dtype(staged.dtype), shape)


class Lent:
    """A runner's own device buffer as a DeviceTensor's memory (edged.backends.DeviceMemory):
    its pointer is refused once the runner has run again or closed, since the bytes it
    lent are gone then; a stale read raises instead of reading another call's output."""

    __slots__ = ("_buffer", "_lender", "_run", "nbytes")

    def __init__(self, buffer: DeviceBuffer, lender: Lender) -> None:
        self._buffer, self._lender, self._run = buffer, lender, lender.runs
        self.nbytes = buffer.nbytes

    @property
    def pointer(self) -> int:
        if self._lender.runs != self._run or not self._buffer.pointer:
            raise CudaError(
                "a runner's kept output was read after that runner ran again or closed: its buffer no longer "
                "holds it (edged.serve.lanes.steps keeps an edge only where its model does not run in between)"
            )
        return self._buffer.pointer


def copy_run_keeping(
    stream: Stream,
    inputs: list[tuple[Staged, np.ndarray | DeviceTensor]],
    enqueue: Callable[[], None],
    outputs: Callable[[], list[tuple[Staged, tuple[int, ...], Lender | None]]],
) -> list[np.ndarray | DeviceTensor]:
    """One call on `stream`: stage the inputs to the device (a host array through its
    pinned buffer, a DeviceTensor device to device), enqueue the run, stage the outputs
    (`outputs()` gives their shapes once the run is enqueued) back, and wait. An output
    given with a Lender stays in its device buffer instead and comes back as a
    DeviceTensor over it (lent until the lender runs again)."""
    try:
        for staged, value in inputs:
            if isinstance(value, np.ndarray):
                staged.upload(stream, value)
            elif isinstance(value.memory, Lent) and value.dtype != staged.dtype:
                # Another runner's output, of another dtype than this input (an engine whose I/O types
                # are not its manifest's): through the host, converted, as it went before it was kept.
                staged.upload(stream, download_now(value))
            else:
                staged.copy_from_device(stream, value)
        enqueue()
        made = [
            staged.download(stream, shape) if lender is None else lender.lend(staged, shape)
            for staged, shape, lender in outputs()
        ]
    except BaseException:
        # A copy already enqueued may still read a client's device memory, which closes
        # once the call lets go of it: wait for it (a failed stream may fail this too).
        with contextlib.suppress(CudaError):
            stream.synchronize()
        raise
    # A kept output's bytes are there once this returns, whichever stream reads them next.
    stream.synchronize()
    # Copies: the pinned buffers are reused by the next call while the reply may still be queued.
    return [value.copy() if isinstance(value, np.ndarray) else value for value in made]
