"""Shared memory for a client on the daemon's machine (docs/protocol.md, "Shared
memory"): a region this client creates, owns and fills, which the daemon maps once;
an input inside it travels as a reference instead of a frame, and an output can be
written into it.

    with Client("ipc:///run/edged/edged.sock") as client:
        region = client.shared_region(64 << 20)          # created, mapped, registered
        frame = region.array((1, 3, 1080, 1920))         # a view to fill, in place
        scores = region.array((1, 10))
        ...fill frame...
        client.infer("model", {"image": frame}, outputs_into={"scores": scores})
        # `scores` now holds the answer, written by the daemon
        client.unregister(region)
        region.close()

On a GPU daemon, device memory the client holds (a decoder's output) is registered by
its CUDA IPC handle, and its inputs are read on the lane's stream, device to device:

        region = client.register_cuda_ipc(handle, nbytes)  # cudaIpcGetMemHandle's 64 bytes
        client.infer("model", {"image": region.tensor(0, (1, 3, 1080, 1920))})
        client.unregister(region)  # before the client frees the memory
"""

from __future__ import annotations

import grp
import os
import secrets
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

from edged.wire.messages import ShmRef
from edged.wire.shm import ShmTensor
from edged.wire.tensors import LITTLE_ENDIAN, wire_name

ALIGN = 64  # each array starts on a cache line
SHM_ROOT = Path("/dev/shm")


class SharedRegion:
    """A POSIX shared-memory object of `size` bytes, created by this client (its name
    starts with `prefix`, the daemon's shm.prefix). `array` hands out views of it, one
    after another; `handle` is what the daemon's shm_register returned (None before)."""

    def __init__(self, size: int, prefix: str = "edged-", group: str | None = None) -> None:
        """`group`: give the object to this group, mode 0660, so that a daemon running as
        another user in it (the units' `edged`) may map it; else it is this user's alone."""
        self._shm = shared_memory.SharedMemory(name=prefix + secrets.token_hex(8), create=True, size=size)
        if group is not None:
            path = SHM_ROOT / self.name
            os.chown(path, -1, grp.getgrnam(group).gr_gid)
            os.chmod(path, 0o660)
        self.size = size
        self.handle: str | None = None
        self._base = np.frombuffer(self._shm.buf, np.uint8)
        self._next = 0

    @property
    def name(self) -> str:
        return self._shm.name.lstrip("/")

    def array(self, shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> np.ndarray:
        """A new view of the region's next free bytes, shaped `shape` (zeros when new)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        start = -(-self._next // ALIGN) * ALIGN
        if start + nbytes > self.size:
            raise MemoryError(f"region {self.name} has {self.size - start} bytes left, fewer than {nbytes}")
        self._next = start + nbytes
        return self._base[start : start + nbytes].view(dtype).reshape(shape)

    def ref(self, array: np.ndarray) -> ShmRef | None:
        """Where `array` lies in this region, if it is a C-ordered view of it; else None."""
        if self.handle is None or not array.flags.c_contiguous:
            return None
        offset = array.__array_interface__["data"][0] - self._base.__array_interface__["data"][0]
        if offset < 0 or offset + array.nbytes > self.size:
            return None
        return ShmRef(self.handle, offset, array.nbytes)

    def tensor(self, array: np.ndarray) -> ShmTensor | None:
        """`array` as an input by reference, if it lies in this region; else None."""
        ref = self.ref(array)
        return None if ref is None else ShmTensor(ref, wire_name(array.dtype), tuple(array.shape))

    def view(self, ref: dict[str, int], dtype: str, shape: list[int]) -> np.ndarray:
        """The output the daemon wrote at `ref` (a reply's {region, offset, bytes})."""
        start = ref["offset"]
        return self._base[start : start + ref["bytes"]].view(LITTLE_ENDIAN[dtype]).reshape(shape)

    def close(self) -> None:
        """Unlink the object and unmap it (every view of it must be gone by then)."""
        self._base = np.empty(0, np.uint8)
        self._shm.unlink()
        self._shm.close()


class CudaIpcRegion:
    """Device memory this client exported (cudaIpcGetMemHandle) and the daemon opened:
    `tensor` names an input in it. The client keeps the memory allocated until it has
    unregistered the region; outputs never go here (they come back as frames, or into a
    SharedRegion)."""

    def __init__(self, ipc_handle: bytes, nbytes: int) -> None:
        self.ipc_handle, self.nbytes = ipc_handle, nbytes
        self.handle: str | None = None  # what shm_register returned

    def tensor(self, offset: int, shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> ShmTensor:
        """An input of `shape` and `dtype` whose bytes start `offset` bytes into the memory."""
        if self.handle is None:
            raise ValueError("this CUDA IPC region is not registered")
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return ShmTensor(ShmRef(self.handle, offset, nbytes), wire_name(dtype), tuple(shape))
