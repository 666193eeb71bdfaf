"""The messages of protocol version 1 as Python sees them: the constants, the statuses,
a request and a reply, the bounds on a request, and the error a bad one raises.
edged.wire.codec turns them into frames and back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import msgspec
import numpy as np

PROTOCOL_VERSION = 1
MAX_ID_BYTES = 64
# The daemon's server.max_message_bytes by default, which its clients assume unless told: ZeroMQ drops the
# connection of a peer that sends a larger frame, and with it the replies of every call in flight on it.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# What a frame may gain on the way: CURVE adds some 33 bytes to each, and ZeroMQ's ZMQ_MAXMSGSIZE counts
# them (a frame within them of server.max_message_bytes drops its connection there).
FRAME_OVERHEAD = 64
MAX_DEADLINE_MS = 3_600_000.0
# The last two: the shared-memory extension (edged.wire.shm).
OPS = ("infer", "models", "health", "stats", "shm_register", "shm_unregister")

RequestId = int | str | bytes | None
Buffer = bytes | memoryview


class Status(StrEnum):
    OK = "OK"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    OVERLOADED = "OVERLOADED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    UNAVAILABLE = "UNAVAILABLE"
    INTERNAL = "INTERNAL"


class ProtocolError(Exception):
    """A request that cannot be served as sent; becomes a reply with `status`."""

    def __init__(
        self, status: Status, message: str, request_id: RequestId = None, fields: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.request_id = request_id
        self.fields = fields or {}  # the reply's other keys (docs/protocol.md), beside status and error


class TensorSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A tensor's name, wire dtype name and shape (-1 marks a dynamic dimension).
    A msgspec struct: edged.wire.fast decodes a request's input specs straight into it,
    and an input map with any other key (an "shm" reference) fails that decode, which
    leaves the request to the checked path."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds checked before anything is allocated for a request."""

    max_header_bytes: int = 64 * 1024
    max_tensors: int = 16
    max_tensor_elements: int = 1 << 24
    # Held by admitted requests not yet answered (edged.serve.pending): in all, and per client.
    max_pending_bytes: int = 1 << 30
    max_pending_bytes_per_peer: int = 1 << 28


@dataclass(frozen=True, slots=True)
class ShmRef:
    """`nbytes` bytes at `offset` in the registered shared-memory region `region` (edged.wire.shm)."""

    region: str
    offset: int
    nbytes: int

    def to_wire(self) -> dict[str, Any]:
        return {"region": self.region, "offset": self.offset, "bytes": self.nbytes}


@dataclass(slots=True)
class Request:
    id: RequestId
    op: str
    model: str | None = None
    klass: str | None = None
    deadline_ms: float | None = None
    inputs: list[TensorSpec] = field(default_factory=list)
    payloads: Sequence[Buffer] = ()  # one per input without a region in `shm_inputs`, in order
    outputs: list[str] | None = None
    memory: bool = False  # op models: each model's weights too ("memory": true)
    region: ShmRef | None = None  # ops shm_register and shm_unregister
    ipc_handle: bytes | None = None  # shm_register of device memory: its CUDA IPC handle
    shm_inputs: dict[str, ShmRef] = field(default_factory=dict)  # inputs in a region, by name
    outputs_shm: dict[str, ShmRef] = field(default_factory=dict)  # outputs to write into a region
    # The daemon's views of shm_inputs' bytes, once resolved against the peer's regions.
    shm_views: dict[str, memoryview] = field(default_factory=dict)
    # Inputs in a CUDA IPC region, once resolved: edged.backends.DeviceTensor, opaque here.
    device_inputs: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Reply:
    """A decoded reply, as a client sees it."""

    id: RequestId
    status: Status
    header: dict[str, Any]
    outputs: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def error(self) -> str:
        return self.header.get("error", "")
