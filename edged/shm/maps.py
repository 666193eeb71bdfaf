"""One client region as the daemon maps it, and the checks at each use: a POSIX object
mapped by name, a sealed memfd handed over a unix socket, a client's device memory
opened by its CUDA IPC handle (DeviceRegion), and where an output goes (Slot). The
registry that holds them, by handle and per connection, is edged.shm.registry.

A memfd region cannot shrink under the daemon: it is refused unless sealed with
F_SEAL_SHRINK, a seal no one can remove. A POSIX object mapped by name can be shrunk
by its client between the size check at each use and the access, a SIGBUS that ends
the daemon: so names are mapped only with `shm.trust_posix_names` (docs/operations.md).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import mmap
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edged.backends import DeviceMemory, DeviceTensor
from edged.wire.messages import ProtocolError, RequestId, ShmRef, Status
from edged.wire.shm import IPC_NAME
from edged.wire.tensors import DTYPES

SHM_ROOT = Path("/dev/shm")
# Who registered a region: a ZeroMQ connection's routing id, or the number of a unix
# connection to the memfd socket (an int: no routing id a client sets can equal it).
Owner = bytes | int


def span_end(ref: ShmRef, nbytes: int, region: str, where: str, request_id: RequestId) -> int:
    """Where the bytes `ref` names end, refused unless they lie within the `nbytes` registered."""
    end = ref.offset + ref.nbytes
    if end > nbytes:
        raise ProtocolError(
            Status.INVALID_ARGUMENT,
            f"{where}: bytes {ref.offset} to {end} lie past the end of {region} ({nbytes} bytes registered)",
            request_id,
        )
    return end


@dataclass(slots=True)
class Region:
    name: str  # the shared-memory object's, or the name a memfd's client gave it
    owner: Owner  # the connection that registered it
    mapping: mmap.mmap
    nbytes: int
    used_ns: int

    def view(self, ref: ShmRef, where: str, request_id: RequestId) -> memoryview:
        """The bytes `ref` names, checked against the region as registered and as it is now."""
        end = span_end(ref, self.nbytes, f"region {self.name!r}", where, request_id)
        if self.mapping.size() < end:  # the object shrank after it was registered
            raise ProtocolError(
                Status.INVALID_ARGUMENT,
                f"{where}: region {self.name!r} has shrunk to {self.mapping.size()} bytes; register it again",
                request_id,
            )
        return memoryview(self.mapping)[ref.offset : end]


@dataclass(slots=True)
class DeviceRegion:
    """A client's device memory, opened by its CUDA IPC handle; read by inputs only."""

    owner: Owner
    memory: DeviceMemory
    nbytes: int
    used_ns: int
    name: str = IPC_NAME

    def tensor(
        self, ref: ShmRef, dtype: str, shape: tuple[int, ...], where: str, request_id: RequestId
    ) -> DeviceTensor:
        """The input `ref` names, checked against the region as registered."""
        span_end(ref, self.nbytes, f"CUDA IPC region {ref.region!r}", where, request_id)
        return DeviceTensor(self.memory, ref.offset, ref.nbytes, DTYPES[dtype], shape)


@dataclass(frozen=True, slots=True)
class Slot:
    """Where an output goes: written once, by whoever answers the request."""

    ref: ShmRef
    region: Region
    target: memoryview

    def check(self, name: str, nbytes: int) -> None:
        """Raise ValueError, with the sentence for the client, where output `name` of `nbytes` does not fit."""
        if nbytes > self.ref.nbytes:
            raise ValueError(
                f"output {name!r} is {nbytes} bytes, but its slot in region {self.ref.region!r} holds {self.ref.nbytes}"
            )
        if self.region.mapping.size() < self.ref.offset + nbytes:
            raise ValueError(f"region {self.ref.region!r} has shrunk; output {name!r} was not written")

    def write(self, name: str, array: np.ndarray) -> ShmRef:
        """Write `array`'s bytes at the slot's start (`check`ed first); the reference to what was written."""
        array = np.ascontiguousarray(array)
        self.check(name, array.nbytes)
        np.frombuffer(self.target, np.uint8, array.nbytes)[:] = array.reshape(-1).view(np.uint8)
        return ShmRef(self.ref.region, self.ref.offset, array.nbytes)


def map_posix(root: Path, name: str, nbytes: int, refuse: Callable[[Status, str], ProtocolError]) -> mmap.mmap:
    """`nbytes` of the POSIX shared-memory object `name` under `root`, mapped read-write."""
    # No symlink is followed, and the name holds no '/' (edged.wire.shm.NAME): only SHM_ROOT's own objects.
    try:
        fd = os.open(root / name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise refuse(Status.NOT_FOUND, "no such shared-memory object; create it (shm_open) first") from None
    except OSError as exc:
        raise refuse(Status.INVALID_ARGUMENT, f"the daemon cannot open it: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise refuse(Status.INVALID_ARGUMENT, "not a shared-memory object")
        if info.st_size < nbytes:
            raise refuse(Status.INVALID_ARGUMENT, f"it is {info.st_size} bytes, fewer than the {nbytes} registered")
        return mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def map_sealed(fd: int, nbytes: int, refuse: Callable[[Status, str], ProtocolError]) -> mmap.mmap:
    """`nbytes` of the memfd `fd`, mapped read-write, once its seals say it cannot shrink."""
    # Seals first: the kernel answers them for its own memory alone, where fstat on a FUSE
    # file waits on the client's server, which could stall the intake thread and the regions' lock.
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise refuse(
                Status.INVALID_ARGUMENT,
                "not a memfd (a file on a file system, a socket, a pipe): send the descriptor memfd_create returned",
            ) from None
        # A descriptor opened with O_PATH: nothing reads through it.
        raise refuse(
            Status.INVALID_ARGUMENT,
            f"the daemon cannot read its seals ({exc.strerror}): send the descriptor memfd_create returned, "
            "open for reading and writing",
        ) from None
    # Every memfd of ordinary pages lives on the kernel's one internal tmpfs. A POSIX object
    # does not, nor a huge-page memfd: a hole punched in it is refilled from the huge-page
    # pool at the daemon's next access, and an empty pool is a SIGBUS, seals or not.
    if os.fstat(fd).st_dev != _memfd_device():
        raise refuse(
            Status.INVALID_ARGUMENT,
            "not a memfd of ordinary pages (a POSIX object, or a huge-page memfd, MFD_HUGETLB, whose pool can run "
            "dry under the daemon): create it with memfd_create(MFD_ALLOW_SEALING)",
        )
    if not seals & fcntl.F_SEAL_SHRINK:
        raise refuse(
            Status.INVALID_ARGUMENT,
            "not sealed against shrinking: add F_SEAL_SHRINK (fcntl F_ADD_SEALS, on a memfd made with "
            "MFD_ALLOW_SEALING) before sending it, so that it cannot be cut short while the daemon uses it",
        )
    # Sealed: the size read now can only grow, so the mapping never reaches past the end.
    size = os.fstat(fd).st_size
    if size < nbytes:
        raise refuse(Status.INVALID_ARGUMENT, f"it is {size} bytes, fewer than the {nbytes} registered")
    try:
        return mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError as exc:
        raise refuse(
            Status.INVALID_ARGUMENT,
            f"the daemon cannot map it for reading and writing ({exc.strerror}): send it open read-write, "
            "and not sealed against writes (the daemon writes outputs there)",
        ) from None


@functools.cache
def _memfd_device() -> int:
    """The device of the file system every memfd of ordinary pages is on (one of the daemon's own, made once)."""
    probe = os.memfd_create("edged-probe", os.MFD_CLOEXEC)
    try:
        return os.fstat(probe).st_dev
    finally:
        os.close(probe)
