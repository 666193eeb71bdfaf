"""Tensors in shared memory: an optional, additive extension of protocol v1
(docs/protocol.md, "Shared memory").

A local client hands the daemon a sealed memfd on its memfd socket (edged.shm.
intake), or, where the daemon trusts it, registers a POSIX shared-memory object by
name (op `shm_register`), and gets back a region: a handle no other client can guess,
valid on every socket of the daemon (a client's class sockets are other connections).
An input may then name a region, an offset and a byte count instead of carrying a
payload frame, and an output may be written into one (`outputs_shm`). On a GPU daemon
a region may instead be device memory the client exports with a CUDA IPC handle
(`cuda_ipc`), read by inputs only. A client that uses none of it sees protocol v1
unchanged. This module reads and writes the references; edged.shm.registry maps the
regions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from edged.wire.messages import ProtocolError, RequestId, ShmRef, Status
from edged.wire.tensors import tensor_frames

SHM_OPS = ("shm_register", "shm_unregister")
# A region's name as shm_open(3) takes it, without the leading slash: one path component.
NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
# cudaIpcMemHandle_t is 64 opaque bytes (CUDA_IPC_HANDLE_SIZE).
IPC_HANDLE_BYTES = 64
# What a CUDA IPC region is called in the daemon's sentences: it has no name of its own.
IPC_NAME = "cuda-ipc"


@dataclass(frozen=True, slots=True)
class ShmTensor:
    """An input that is already in a registered region (what edged.client sends for an
    array inside one): where it is, and what it holds."""

    ref: ShmRef
    dtype: str
    shape: tuple[int, ...]


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_ref(raw: Any, where: str, request_id: RequestId) -> ShmRef:
    """A {region, offset, bytes} map, checked for its types; raises ProtocolError."""
    if not isinstance(raw, dict):
        raise ProtocolError(Status.INVALID_ARGUMENT, f"{where} must be a map with region, offset and bytes", request_id)
    region, offset, nbytes = raw.get("region"), raw.get("offset"), raw.get("bytes")
    if not isinstance(region, str) or not NAME.fullmatch(region):
        raise ProtocolError(
            Status.INVALID_ARGUMENT,
            f"{where}.region must be what shm_register returned, got {region!r}",
            request_id,
        )
    if not _count(offset) or not _count(nbytes):
        raise ProtocolError(Status.INVALID_ARGUMENT, f"{where}: offset and bytes must be integers >= 0", request_id)
    return ShmRef(region, offset, nbytes)


def read_outputs_shm(header: dict[str, Any], request_id: RequestId) -> dict[str, ShmRef]:
    """The header's `outputs_shm`: by output name, where to write it ({} when absent)."""
    raw = header.get("outputs_shm")
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(name, str) for name in raw):
        raise ProtocolError(
            Status.INVALID_ARGUMENT, "'outputs_shm' must map output names to {region, offset, bytes}", request_id
        )
    return {name: read_ref(ref, f"outputs_shm[{name!r}]", request_id) for name, ref in raw.items()}


def read_region(header: dict[str, Any], op: str, request_id: RequestId) -> ShmRef:
    """What an `shm_register` names (the object's `name` and `bytes` > 0), or the region
    an `shm_unregister` gives back (the `region` its registration returned)."""
    key = "name" if op == "shm_register" else "region"
    name, nbytes = header.get(key), header.get("bytes", 0)
    if not isinstance(name, str) or not NAME.fullmatch(name):
        what = "a shared-memory object's name without its '/'" if key == "name" else "what shm_register returned"
        raise ProtocolError(
            Status.INVALID_ARGUMENT,
            f"op {op!r} needs {key!r}, {what} (letters, digits, '.', '_', '-'), got {name!r}",
            request_id,
        )
    if op == "shm_register" and (not _count(nbytes) or not nbytes):
        raise ProtocolError(Status.INVALID_ARGUMENT, "op 'shm_register' needs 'bytes', an integer > 0", request_id)
    return ShmRef(name, 0, nbytes if op == "shm_register" else 0)


def read_ipc(header: dict[str, Any], request_id: RequestId) -> tuple[ShmRef, bytes]:
    """What an `shm_register` of device memory names: its CUDA IPC handle (`cuda_ipc`,
    64 bytes of bin) and its `bytes` > 0."""
    handle, nbytes = header.get("cuda_ipc"), header.get("bytes", 0)
    if not isinstance(handle, bytes) or len(handle) != IPC_HANDLE_BYTES:
        got = f"{len(handle)} bytes" if isinstance(handle, bytes) else type(handle).__name__
        raise ProtocolError(
            Status.INVALID_ARGUMENT,
            f"'cuda_ipc' must be the {IPC_HANDLE_BYTES} bytes of a cudaIpcMemHandle_t, as bin; got {got}",
            request_id,
        )
    if not _count(nbytes) or not nbytes:
        raise ProtocolError(Status.INVALID_ARGUMENT, "op 'shm_register' needs 'bytes', an integer > 0", request_id)
    return ShmRef(IPC_NAME, 0, nbytes), handle


def read_shm_op(header: dict[str, Any], op: str, request_id: RequestId) -> tuple[ShmRef, bytes | None]:
    """An shm op's region, and the CUDA IPC handle of a registration of device memory (else None)."""
    if op == "shm_register" and "cuda_ipc" in header:
        return read_ipc(header, request_id)
    return read_region(header, op, request_id), None


def write_region(header: dict[str, Any], op: str, region: ShmRef, cuda_ipc: bytes | None) -> None:
    """An shm op's fields: shm_register's object name (or CUDA IPC handle) and size; shm_unregister's region."""
    if op != "shm_register":
        header["region"] = region.region
    elif cuda_ipc is not None:
        header["cuda_ipc"], header["bytes"] = cuda_ipc, region.nbytes
    else:
        header["name"], header["bytes"] = region.region, region.nbytes


def input_entries(inputs: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    """A request's `inputs` entries, in order, and the payload frames of those sent as
    frames: an array is a frame, a ShmTensor a reference to the region that holds it."""
    framed = {name: value for name, value in inputs.items() if not isinstance(value, ShmTensor)}
    specs, payloads = tensor_frames(framed)
    by_name = {spec["name"]: spec for spec in specs}
    entries = [
        {"name": name, "dtype": value.dtype, "shape": list(value.shape), "shm": value.ref.to_wire()}
        if isinstance(value, ShmTensor)
        else by_name[name]
        for name, value in inputs.items()
    ]
    return entries, payloads
