"""The well-formed request and the OK reply, in compiled code.

msgspec decodes a request's header straight into typed structs and packs an OK
reply's header from one: several times faster than edged.wire.codec's checked
decode and encode, and faster than msgpack.unpackb alone (docs/benchmarks.md).

This is the path of the common case only. A header it cannot take, or one that
breaks any rule of the protocol, gives None here, and the checked path decodes it
again: every error keeps the message that path writes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from edged.wire.codec import (
    MAX_DEADLINE_MS,
    MAX_ID_BYTES,
    OPS,
    PROTOCOL_VERSION,
    Buffer,
    Limits,
    Request,
    RequestId,
    Status,
    TensorSpec,
)
from edged.wire.shm import SHM_OPS
from edged.wire.tensors import DTYPES

# The dtypes whose arrays export their bytes as they are (ml_dtypes' do not: the
# checked path sends those as uint8 views).
_PLAIN = {DTYPES[name]: name for name in ("float32", "float16", "int8", "uint8", "int32", "int64", "bool")}


# A key it does not declare fails the decode, leaving the request to the checked path:
# msgspec would skip that key's value unread, and serve what msgpack cannot decode.
class _Header(msgspec.Struct, forbid_unknown_fields=True):
    v: int
    id: Any = None
    op: str = "infer"
    klass: str | None = msgspec.field(default=None, name="class")
    model: str | None = None
    deadline_ms: float | None = None
    inputs: list[TensorSpec] | None = None
    outputs: list[str] | None = None
    memory: bool = False
    outputs_shm: Any = None


class _Timing(msgspec.Struct):
    queue: int
    compute: int
    total: int


class _OkHeader(msgspec.Struct):
    v: int
    id: Any
    status: str
    timing_us: _Timing
    outputs: list[TensorSpec]


class _OverloadedHeader(msgspec.Struct):
    v: int
    id: Any
    status: str
    error: str
    retry_after_ms: float
    timing_us: _Timing


_decoder = msgspec.msgpack.Decoder(_Header)
_encode = msgspec.msgpack.Encoder().encode


def decode_request(frames: Sequence[Buffer], limits: Limits) -> Request | None:
    """The request, when it is well formed in every respect; else None (the checked path decides)."""
    if not frames or len(frames[0]) > limits.max_header_bytes:
        return None
    try:
        header = _decoder.decode(frames[0])
    except Exception:  # garbage raises more than MsgspecError (invalid UTF-8: UnicodeDecodeError)
        return None
    request_id = header.id
    kind = type(request_id)
    if kind is str:
        if len(request_id) * 4 > MAX_ID_BYTES and len(request_id.encode()) > MAX_ID_BYTES:
            return None
    elif kind is bytes:
        if len(request_id) > MAX_ID_BYTES:
            return None
    elif kind is not int:
        return None
    if header.v != PROTOCOL_VERSION:
        return None
    if header.op != "infer":
        if header.op not in OPS or header.op in SHM_OPS or len(frames) > 1:
            return None
        return Request(id=request_id, op=header.op, klass=header.klass, memory=header.memory)
    deadline = header.deadline_ms
    if deadline is not None:
        if not (math.isfinite(deadline) and deadline > 0):
            return None
        deadline = min(deadline, MAX_DEADLINE_MS)
    specs = header.inputs
    payloads = frames[1:]
    # An input in shared memory (an "shm" key) fails TensorSpec's decode above: the checked path reads it.
    if (
        header.model is None
        or header.outputs_shm is not None
        or not specs
        or len(specs) > limits.max_tensors
        or len(specs) != len(payloads)
    ):
        return None
    for spec, payload in zip(specs, payloads):
        dtype = DTYPES.get(spec.dtype)
        # A zero dimension is left to the checked path, which counts elements without it.
        if dtype is None or not all(d > 0 for d in spec.shape):
            return None
        elements = math.prod(spec.shape)
        if elements > limits.max_tensor_elements or len(payload) != elements * dtype.itemsize:
            return None
    return Request(
        id=request_id,
        op="infer",
        model=header.model,
        klass=header.klass,
        deadline_ms=deadline,
        inputs=specs,
        payloads=payloads,
        outputs=header.outputs,
    )


def encode_ok(
    request_id: RequestId, queue_us: int, compute_us: int, total_us: int, outputs: dict[str, np.ndarray]
) -> list[Buffer] | None:
    """An OK reply's frames, when every output is a C-ordered array of a plain dtype;
    else None (edged.wire.codec.encode_reply converts, or refuses, the rest)."""
    specs, payloads = [], []
    for name, array in outputs.items():
        dtype = _PLAIN.get(array.dtype)
        if dtype is None or not array.ndim or not array.flags.c_contiguous:
            return None
        specs.append(TensorSpec(name, dtype, array.shape))
        payloads.append(array.data)
    header = _OkHeader(PROTOCOL_VERSION, request_id, "OK", _Timing(queue_us, compute_us, total_us), specs)
    return [_encode(header), *payloads]


def encode_overloaded(request_id: RequestId, message: str, retry_after_ms: float, total_us: int) -> list[Buffer]:
    """An OVERLOADED reply's one frame: the same bytes as the checked encoder's, packed
    from a struct, since a burst is answered mostly with these."""
    timing = _Timing(0, 0, total_us)
    header = _OverloadedHeader(PROTOCOL_VERSION, request_id, Status.OVERLOADED.value, message, retry_after_ms, timing)
    return [_encode(header)]
