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
MAX_DEADLINE_MS = 3_600_000.0
OPS = ("infer", "models", "health", "stats")

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

    def __init__(self, status: Status, message: str, request_id: RequestId = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.request_id = request_id


class TensorSpec(msgspec.Struct, frozen=True):
    """A tensor's name, wire dtype name and shape (-1 marks a dynamic dimension).
    A msgspec struct: edged.wire.fast decodes a request's input specs straight into it."""

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


@dataclass(slots=True)
class Request:
    id: RequestId
    op: str
    model: str | None = None
    klass: str | None = None
    deadline_ms: float | None = None
    inputs: list[TensorSpec] = field(default_factory=list)
    payloads: Sequence[Buffer] = ()
    outputs: list[str] | None = None
    memory: bool = False  # op models: each model's weights too ("memory": true)


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
