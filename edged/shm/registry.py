"""The shared-memory regions local clients registered (edged.wire.shm): mapped once at
registration, then read as inputs and written as outputs in place, with no copy.

A region is known by a handle the daemon draws at random (128 bits), not by the
client's connection: a client's class sockets are other connections, and ZeroMQ's
own peer ids are small counters another client could set on a socket of its own.
Limits count the regions of the connection that registered them: a ZeroMQ connection's
(its peer and its descriptor: edged.serve.transport.when_closed), or a unix connection's on
the memfd socket (edged.shm.intake). Either's regions are forgotten when it closes.

Written by several threads: the serving loops (dispatch: registers by name, resolves,
unregisters, forgets a closed connection's), the steering thread (sweeps) and the memfd intake's thread
(registers memfds, forgets a closed connection's). So every use of the table holds
`_lock`; it is held for microseconds (a lookup, an fstat, an mmap). A request's views
keep their region mapped: Python unmaps an mmap only once nothing views it, so a
region unregistered, swept or forgotten while a request reads it stays mapped until
that request is answered.

Each region is mapped, and checked at each use, by edged.shm.maps, which says
why a memfd must be sealed against shrinking and a name is mapped only with
`shm.trust_posix_names`.

On a GPU backend a region may instead be a client's device memory, registered by its
CUDA IPC handle (DeviceRegion): opened once, through the backend (edged.backends.
OpeningIpc, so this module imports no runtime), read by inputs as DeviceTensors that
keep it open, and closed once neither the registry nor any request holds it.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edged.backends import BackendError, DeviceMemory
from edged.config.shm import ShmConfig
from edged.shm.maps import SHM_ROOT, DeviceRegion, Owner, Region, Slot, map_posix, map_sealed
from edged.wire.messages import ProtocolError, Request, RequestId, ShmRef, Status


class Regions:
    """The registered regions, by handle, within the limits of `[shm]`; every use of
    `_regions` holds `_lock` (two threads write it: see the module's docstring)."""

    def __init__(self, config: ShmConfig, root: Path = SHM_ROOT) -> None:
        self.config = config
        self._root = root
        self._regions: dict[str, Region | DeviceRegion] = {}
        self._lock = threading.Lock()
        # How a CUDA IPC region is opened: the backend's open_ipc, set while a GPU backend
        # serves (edged.serve.dispatch); None: the refusal says why, naming `backend`.
        self.open_device: Callable[[bytes, int], DeviceMemory] | None = None
        self.backend = ""

    def register(self, owner: bytes, ref: ShmRef, local: bool, request_id: RequestId) -> str:
        """Map the object `ref.region`, `ref.nbytes` long, for the connection `owner`; its handle.
        Raises ProtocolError."""
        self._check_open(local, request_id)
        config, name = self.config, ref.region

        def refuse(status: Status, message: str) -> ProtocolError:
            return ProtocolError(status, f"shared-memory object {name!r}: {message}", request_id)

        if not config.trust_posix_names:
            raise refuse(
                Status.INVALID_ARGUMENT,
                "this daemon maps no shared memory by name ([shm] trust_posix_names = false: a client could shrink "
                "the object under it); hand it a sealed memfd on its shm socket instead (docs/protocol.md)",
            )
        if not name.startswith(config.prefix):
            raise refuse(Status.INVALID_ARGUMENT, f"this daemon maps only names that start with {config.prefix!r}")
        with self._lock:
            self._check_limits(owner, ref.nbytes, refuse)
            mapping = map_posix(self._root, name, ref.nbytes, refuse)
            return self._add(Region(name, owner, mapping, ref.nbytes, time.monotonic_ns()))

    def register_fd(self, owner: int, fd: int, nbytes: int, name: str, request_id: RequestId) -> str:
        """Map `nbytes` of the memfd `fd` a client handed over (edged.shm.intake) for
        the unix connection `owner`; its handle. Refused, with a sentence, unless it is a
        memfd sealed against shrinking and at least `nbytes` long. Raises ProtocolError."""

        def refuse(status: Status, message: str) -> ProtocolError:
            return ProtocolError(status, f"memfd {name!r}: {message}", request_id)

        with self._lock:
            self._check_limits(owner, nbytes, refuse)
            mapping = map_sealed(fd, nbytes, refuse)
            return self._add(Region(name, owner, mapping, nbytes, time.monotonic_ns()))

    def forget(self, owner: Owner) -> None:
        """Forget the regions `owner` registered (its connection closed); each is unmapped
        once no request reads it."""
        with self._lock:
            for handle in [handle for handle, region in self._regions.items() if region.owner == owner]:
                del self._regions[handle]

    def register_ipc(self, owner: bytes, handle: bytes, nbytes: int, local: bool, request_id: RequestId) -> str:
        """Open the device memory a CUDA IPC `handle` exports, `nbytes` long, for the connection `owner`, once;
        its region handle. Raises ProtocolError."""
        self._check_open(local, request_id)

        def refuse(status: Status, message: str) -> ProtocolError:
            return ProtocolError(status, f"CUDA IPC region: {message}", request_id)

        if self.open_device is None:
            raise refuse(
                Status.INVALID_ARGUMENT,
                f"this daemon serves on server.backend = {self.backend!r}, not a GPU backend, so it cannot read "
                "device memory; register a POSIX shared-memory object instead",
            )
        with self._lock:
            self._check_limits(owner, nbytes, refuse)
        # Opened outside the lock, which every loop takes to resolve a request's regions: a first
        # open maps the client's allocation, and may take milliseconds.
        try:
            memory = self.open_device(handle, nbytes)
        except BackendError as exc:
            raise refuse(Status.INVALID_ARGUMENT, str(exc)) from None
        with self._lock:
            # Again: registrations may have come meanwhile. Refused, the memory closes with its last reference.
            self._check_limits(owner, nbytes, refuse)
            return self._add(DeviceRegion(owner, memory, nbytes, time.monotonic_ns()))

    def unregister(self, handle: str, local: bool, request_id: RequestId) -> None:
        self._check_open(local, request_id)
        with self._lock:
            if self._regions.pop(handle, None) is None:
                raise ProtocolError(Status.NOT_FOUND, f"no region {handle!r} is registered", request_id)

    def resolve(self, request: Request, local: bool) -> dict[str, Slot]:
        """Point the request's shared-memory inputs at their bytes (`shm_views`) and return
        where its outputs go; raises ProtocolError for any reference that does not hold."""
        self._check_open(local, request.id)
        with self._lock:
            return self._resolve(request)

    def _resolve(self, request: Request) -> dict[str, Slot]:
        now_ns = time.monotonic_ns()
        for name, ref in request.shm_inputs.items():
            region = self._region(ref, request.id, now_ns)
            if isinstance(region, DeviceRegion):
                spec = next(spec for spec in request.inputs if spec.name == name)
                tensor = region.tensor(ref, spec.dtype, spec.shape, f"input {name!r}", request.id)
                request.device_inputs[name] = tensor
            else:
                request.shm_views[name] = region.view(ref, f"input {name!r}", request.id)
        slots = {}
        for name, ref in request.outputs_shm.items():
            region = self._region(ref, request.id, now_ns)
            if isinstance(region, DeviceRegion):
                raise ProtocolError(
                    Status.INVALID_ARGUMENT,
                    f"output {name!r}: region {ref.region!r} is a CUDA IPC region, which inputs read; outputs go "
                    "into POSIX shared-memory regions or come back as frames",
                    request.id,
                )
            slots[name] = Slot(ref, region, region.view(ref, f"output {name!r}", request.id))
        return slots

    def sweep(self, now_ns: int) -> None:
        """Forget the regions unused for shm.idle_s: their clients are likely gone."""
        idle_ns = self.config.idle_s * 1_000_000_000
        with self._lock:
            for handle in [handle for handle, region in self._regions.items() if now_ns - region.used_ns > idle_ns]:
                del self._regions[handle]

    def figures(self) -> dict[str, Any]:
        with self._lock:
            regions = list(self._regions.values())
        return {"regions": len(regions), "bytes": sum(region.nbytes for region in regions)}

    def _add(self, region: Region | DeviceRegion) -> str:
        """Register `region` under a new handle (128 random bits), and return it (`_lock` held)."""
        handle = "r" + secrets.token_hex(16)
        self._regions[handle] = region
        return handle

    def _check_open(self, local: bool, request_id: RequestId) -> None:
        if not self.config.enabled:
            raise ProtocolError(
                Status.INVALID_ARGUMENT,
                "shared memory is off on this daemon ([shm] enabled = false); send tensors as payload frames",
                request_id,
            )
        if not local:
            raise ProtocolError(
                Status.INVALID_ARGUMENT,
                "shared memory is served on ipc endpoints only; send tensors as payload frames here",
                request_id,
            )

    def _check_limits(self, peer: Owner, nbytes: int, refuse: Callable[[Status, str], ProtocolError]) -> None:
        """shm.max_region_mb, and the daemon's regions and the peer's (every kind together) against their limits
        (`_lock` held)."""
        config = self.config
        if nbytes > config.max_region_bytes:
            raise refuse(
                Status.INVALID_ARGUMENT,
                f"{nbytes} bytes is over the largest region this daemon maps (shm.max_region_mb = "
                f"{config.max_region_mb})",
            )
        if len(self._regions) >= config.max_regions:
            raise refuse(
                Status.UNAVAILABLE,
                f"the daemon has {len(self._regions)} regions registered, the most it maps (shm.max_regions): "
                "retry once its clients have unregistered some",
            )
        held = [region for region in self._regions.values() if region.owner == peer]
        if len(held) >= config.max_regions_per_peer:
            raise refuse(
                Status.INVALID_ARGUMENT,
                f"this client has {len(held)} regions registered, the most it may (shm.max_regions_per_peer); "
                "unregister one first",
            )
        if sum(region.nbytes for region in held) + nbytes > config.max_bytes_per_peer:
            raise refuse(
                Status.INVALID_ARGUMENT,
                f"it would take this client's regions past shm.max_mb_per_peer = {config.max_mb_per_peer}",
            )

    def _region(self, ref: ShmRef, request_id: RequestId, now_ns: int) -> Region | DeviceRegion:
        region = self._regions.get(ref.region)
        if region is None:
            raise ProtocolError(
                Status.INVALID_ARGUMENT,
                f"no region {ref.region!r} is registered (op shm_register returns one; one is forgotten when the "
                "connection that registered it closes, and an unused one is forgotten after shm.idle_s)",
                request_id,
            )
        region.used_ns = now_ns
        return region
