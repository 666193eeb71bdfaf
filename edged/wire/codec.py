"""The wire codec of protocol version 1: pure encode and decode, no sockets.

Shared by the daemon and the clients. Frames here are what follows the ZeroMQ
routing envelope: `[header, payload_0, payload_1, ...]`, the header a msgpack map.
Decoding checks structure only (types, dtype names, shapes against byte counts), each
header field by edged.wire.header; checking a request against a model's signature is
`edged.wire.signature`'s job. The messages themselves are edged.wire.messages'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from edged.wire.header import deadline_of, input_specs, output_names_of, request_id_of, unpack_header
from edged.wire.messages import (
    MAX_DEADLINE_MS,
    MAX_ID_BYTES,
    OPS,
    PROTOCOL_VERSION,
    Buffer,
    Limits,
    ProtocolError,
    Reply,
    Request,
    RequestId,
    ShmRef,
    Status,
    TensorSpec,
)
from edged.wire.shm import SHM_OPS, ShmTensor, input_entries, read_outputs_shm, read_shm_op, write_region
from edged.wire.tensors import DTYPES, tensor_frames, view

# The messages are imported from here too, beside the functions that encode them.
__all__ = [
    "DTYPES",
    "MAX_DEADLINE_MS",
    "MAX_ID_BYTES",
    "OPS",
    "PROTOCOL_VERSION",
    "Buffer",
    "Limits",
    "ProtocolError",
    "Reply",
    "Request",
    "RequestId",
    "ShmRef",
    "Status",
    "TensorSpec",
    "decode_reply",
    "decode_request",
    "encode_reply",
    "encode_request",
    "tensor_views",
]

DEFAULT_LIMITS = Limits()


# --- request ---------------------------------------------------------------


def encode_request(
    request_id: RequestId,
    op: str = "infer",
    *,
    model: str | None = None,
    klass: str | None = None,
    deadline_ms: float | None = None,
    inputs: dict[str, np.ndarray | ShmTensor] | None = None,
    outputs: Sequence[str] | None = None,
    memory: bool = False,
    outputs_shm: dict[str, ShmRef] | None = None,
    region: ShmRef | None = None,
    cuda_ipc: bytes | None = None,
) -> list[Buffer]:
    """Frames of one request; tensors go out as views of their own buffers, or as
    references to the registered regions that hold them (ShmTensor). An shm_register
    with `cuda_ipc` registers device memory by that handle, `region.nbytes` long."""
    header: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": request_id, "op": op}
    if memory:
        header["memory"] = True
    if model is not None:
        header["model"] = model
    if klass is not None:
        header["class"] = klass
    if deadline_ms is not None:
        header["deadline_ms"] = deadline_ms
    if outputs is not None:
        header["outputs"] = list(outputs)
    if outputs_shm:
        header["outputs_shm"] = {name: ref.to_wire() for name, ref in outputs_shm.items()}
    if region is not None:
        write_region(header, op, region, cuda_ipc)
    if inputs is None:
        return [msgpack.packb(header)]
    header["inputs"], payloads = input_entries(inputs)
    return [msgpack.packb(header), *payloads]


def decode_request(frames: Sequence[Buffer], limits: Limits = DEFAULT_LIMITS) -> Request:
    """Parse and structurally check one request; raises ProtocolError."""
    if not frames:
        raise ProtocolError(Status.INVALID_ARGUMENT, "empty message: expected a msgpack header frame")
    header = unpack_header(frames[0], limits)
    request_id = request_id_of(header)
    version = header.get("v")
    # An int, not merely equal to one: True and 1.0 compare equal to 1 in Python.
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(
            Status.INVALID_ARGUMENT,
            f"unsupported protocol version {version!r}: this daemon speaks v={PROTOCOL_VERSION}",
            request_id,
        )
    op = header.get("op", "infer")
    if op not in OPS:
        raise ProtocolError(Status.NOT_FOUND, f"unknown op {op!r}: expected one of {', '.join(OPS)}", request_id)
    request = Request(id=request_id, op=op)
    klass = header.get("class")
    if klass is not None and not isinstance(klass, str):
        raise ProtocolError(Status.INVALID_ARGUMENT, "'class' must be a string", request_id)
    request.klass = klass
    request.memory = header.get("memory") is True
    if op != "infer":
        if len(frames) > 1:
            raise ProtocolError(Status.INVALID_ARGUMENT, f"op {op!r} takes no payload frames", request_id)
        if op in SHM_OPS:
            request.region, request.ipc_handle = read_shm_op(header, op, request_id)
        return request
    request.model = header.get("model")
    if not isinstance(request.model, str):
        raise ProtocolError(Status.INVALID_ARGUMENT, "op 'infer' needs 'model', a string", request_id)
    request.deadline_ms = deadline_of(header, request_id)
    request.inputs, request.shm_inputs = input_specs(header, len(frames) - 1, limits, request_id)
    request.payloads = frames[1:]
    payloads = iter(request.payloads)
    for spec in request.inputs:
        expected = math.prod(spec.shape) * DTYPES[spec.dtype].itemsize
        ref = request.shm_inputs.get(spec.name)
        got, what = (ref.nbytes, "its region's bytes") if ref else (len(next(payloads)), "payload")
        if got != expected:
            raise ProtocolError(
                Status.INVALID_ARGUMENT,
                f"input {spec.name!r}: {what} has {got} bytes, but shape {list(spec.shape)} "
                f"of {spec.dtype} needs {expected}",
                request_id,
            )
    request.outputs = output_names_of(header, request_id)
    request.outputs_shm = read_outputs_shm(header, request_id)
    return request


def tensor_views(request: Request) -> dict[str, Any]:
    """The request's inputs as numpy arrays over the received frames, or over the regions
    that hold them (`shm_views`): no copies. An input in device memory stays the
    edged.backends.DeviceTensor the regions made of it (`device_inputs`)."""
    payloads = iter(request.payloads)
    views, device = request.shm_views, request.device_inputs
    return {
        spec.name: device[spec.name]
        if spec.name in device
        else view(views[spec.name] if spec.name in views else next(payloads), spec.dtype, spec.shape)
        for spec in request.inputs
    }


# --- reply -----------------------------------------------------------------


def encode_reply(
    request_id: RequestId,
    status: Status,
    *,
    error: str | None = None,
    outputs: dict[str, np.ndarray] | None = None,
    written: dict[str, ShmRef] | None = None,
    **fields: Any,
) -> list[Buffer]:
    """Frames of one reply. `fields` are extra header keys (timing_us, models, ...).
    The outputs in `written` were written into the client's regions: described, not sent."""
    header: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": request_id, "status": status.value}
    if error is not None:
        header["error"] = error
    header.update(fields)
    payloads: list[Buffer] = []
    if outputs is not None:
        specs, frames = tensor_frames(outputs)
        written = written or {}
        for spec, frame in zip(specs, frames):
            if spec["name"] in written:
                spec["shm"] = written[spec["name"]].to_wire()
            else:
                payloads.append(frame)
        header["outputs"] = specs
    return [msgpack.packb(header), *payloads]


def decode_reply(frames: Sequence[Buffer]) -> Reply:
    """Parse one reply; outputs become arrays over the received frames."""
    if not frames:
        raise ValueError("empty reply")
    header = msgpack.unpackb(frames[0], raw=False, strict_map_key=False)
    status = Status(header["status"])
    outputs: dict[str, np.ndarray] = {}
    if status is Status.OK and isinstance(header.get("outputs"), list):
        # An output written into the client's region has no frame: the client reads it there.
        framed = [spec for spec in header["outputs"] if "shm" not in spec]
        for spec, payload in zip(framed, frames[1:]):
            outputs[spec["name"]] = view(payload, spec["dtype"], spec["shape"])
    return Reply(id=header.get("id"), status=status, header=header, outputs=outputs)
