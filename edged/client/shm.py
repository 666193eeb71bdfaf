"""Shared memory for a client on the daemon's machine (docs/protocol.md, "Shared
memory"): a region this client creates, owns and fills, which the daemon maps once;
an input inside it travels as a reference instead of a frame, and an output can be
written into it.

    with Client("ipc:///run/edged/edged.sock") as client:
        region = client.shared_region(64 << 20)          # created, sealed, handed over
        frame = region.array((1, 3, 1080, 1920))         # a view to fill, in place
        scores = region.array((1, 10))
        ...fill frame...
        client.infer("model", {"image": frame}, outputs_into={"scores": scores})
        # `scores` now holds the answer, written by the daemon
        client.unregister(region)
        region.close()

A region is a memfd sealed against shrinking, handed to the daemon over its memfd
socket (FdChannel): the client cannot cut it short under the daemon. A daemon that
trusts its clients (`[shm] trust_posix_names = true`) also maps POSIX objects by
name (NamedRegion, `shared_region(..., named=True)`).

On a GPU daemon, device memory the client holds (a decoder's output) is registered by
its CUDA IPC handle, and its inputs are read on the lane's stream, device to device:

        region = client.register_cuda_ipc(handle, nbytes)  # cudaIpcGetMemHandle's 64 bytes
        client.infer("model", {"image": region.tensor(0, (1, 3, 1080, 1920))})
        client.unregister(region)  # before the client frees the memory
"""

from __future__ import annotations

import fcntl
import grp
import mmap
import os
import secrets
import socket
import threading
from multiprocessing import shared_memory
from pathlib import Path

import msgpack
import numpy as np

from edged.client.errors import InvalidArgument, NoReply
from edged.wire.codec import PROTOCOL_VERSION, Reply, ShmRef, decode_reply
from edged.wire.endpoints import shm_socket_path
from edged.wire.shm import ShmTensor
from edged.wire.tensors import LITTLE_ENDIAN, wire_name

ALIGN = 64  # each array starts on a cache line
SHM_ROOT = Path("/dev/shm")
# No shrinking (what the daemon checks), no growing, and no seal added or taken later.
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
REPLY_BYTES = 4096  # a registration's reply is some tens of bytes


class SharedRegion:
    """A memfd of `size` bytes, created by this client and sealed against shrinking (its
    name, shown in the daemon's sentences, starts with `prefix`). `array` hands out views
    of it, one after another; `handle` is what the daemon's shm_register returned (None
    before)."""

    def __init__(self, size: int, prefix: str = "edged-") -> None:
        self.name, self.size = prefix + secrets.token_hex(8), size
        self.fd = os.memfd_create(self.name, os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, SEALS)
            self._mapping = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self._start(self._mapping)

    def _start(self, memory: mmap.mmap | memoryview) -> None:
        """Views of `memory` from its start; not registered yet."""
        self.handle: str | None = None
        self._base = np.frombuffer(memory, np.uint8)
        self._next = 0

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
        # The wire is little-endian: an array in another byte order goes as a frame, converted.
        ref = self.ref(array) if little_endian(array.dtype) else None
        return None if ref is None else ShmTensor(ref, wire_name(array.dtype), tuple(array.shape))

    def view(self, ref: dict[str, int], dtype: str, shape: list[int]) -> np.ndarray:
        """The output the daemon wrote at `ref` (a reply's {region, offset, bytes})."""
        start = ref["offset"]
        return self._base[start : start + ref["bytes"]].view(LITTLE_ENDIAN[dtype]).reshape(shape)

    def close(self) -> None:
        """Unmap the memfd and close it (every view of it must be gone by then); the
        daemon's mapping, if it still holds one, stays valid."""
        self._base = np.empty(0, np.uint8)
        self._mapping.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class NamedRegion(SharedRegion):
    """A POSIX shared-memory object of `size` bytes (its name starts with `prefix`, the
    daemon's shm.prefix), registered by name: only a daemon with
    `[shm] trust_posix_names = true` maps it, for the client could shrink it."""

    def __init__(self, size: int, prefix: str = "edged-", group: str | None = None) -> None:
        """`group`: give the object to this group, mode 0660, so that a daemon running as
        another user in it (the units' `edged`) may map it; else it is this user's alone.
        No memfd: SharedRegion's own start is left out."""
        self._shm = shared_memory.SharedMemory(name=prefix + secrets.token_hex(8), create=True, size=size)
        self.name, self.size = self._shm.name.lstrip("/"), size
        if group is not None:
            path = SHM_ROOT / self.name
            os.chown(path, -1, grp.getgrnam(group).gr_gid)
            os.chmod(path, 0o660)
        self._start(self._shm.buf)

    def close(self) -> None:
        """Unlink the object and unmap it (every view of it must be gone by then)."""
        self._base = np.empty(0, np.uint8)
        self._shm.unlink()
        self._shm.close()


class FdChannel:
    """This client's connection to the daemon's memfd socket, beside the ipc `endpoint`:
    where a SharedRegion's memfd is handed over (one message: the request and the
    descriptor). The daemon forgets the regions of a connection once it closes, so it
    stays open for the client's life. Thread-safe: one exchange at a time."""

    def __init__(self, endpoint: str) -> None:
        self._path = shm_socket_path(endpoint)
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._ids = 0

    def register(self, region: SharedRegion, timeout_ms: float) -> Reply:
        """shm_register `region`'s memfd; the daemon's reply (raises NoReply, or
        InvalidArgument where no memfd socket can be reached)."""
        with self._lock:
            self._ids += 1
            request_id = self._ids
            request = {"v": PROTOCOL_VERSION, "id": request_id, "op": "shm_register", "name": region.name}
            request["bytes"] = region.size
            sock = self._connected(timeout_ms)
            try:
                socket.send_fds(sock, [msgpack.packb(request)], [region.fd])
                while True:
                    data = sock.recv(REPLY_BYTES)
                    if not data:
                        self.close()
                        raise NoReply(f"the daemon closed its memfd socket {self._path} without a reply")
                    reply = decode_reply([data])
                    if reply.id == request_id:  # else a late reply to a request that timed out
                        return reply
            except TimeoutError:
                raise NoReply(
                    f"no reply from the daemon's memfd socket {self._path} within {timeout_ms:.0f} ms"
                ) from None
            except OSError as exc:
                self.close()  # broken: the daemon has forgotten its regions already
                raise NoReply(f"the daemon's memfd socket {self._path} failed: {exc.strerror}") from None

    def close(self) -> None:
        """Close the connection: the daemon forgets every region registered on it."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _connected(self, timeout_ms: float) -> socket.socket:
        if self._path is None:
            raise InvalidArgument("shared memory is served on ipc endpoints only; send tensors as payload frames")
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            try:
                sock.connect(self._path)
            except OSError as exc:
                sock.close()
                raise InvalidArgument(
                    f"cannot reach the daemon's memfd socket {self._path} ({exc.strerror}): a daemon has it only "
                    "with [shm] enabled = true ([shm] enabled = false is the default)"
                ) from None
            self._sock = sock
        self._sock.settimeout(timeout_ms / 1000)
        return self._sock


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


def little_endian(dtype: np.dtype) -> bool:
    """Whether `dtype`'s bytes are in the wire's order (one-byte types always are)."""
    return dtype.newbyteorder("<") == dtype
