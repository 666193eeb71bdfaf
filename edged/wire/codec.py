"""The wire codec of protocol version 1: pure encode and decode, no sockets.

Shared by the daemon and the clients. Frames here are what follows the ZeroMQ
routing envelope: `[header, payload_0, payload_1, ...]`, the header a msgpack map.
Decoding checks structure only (types, dtype names, shapes against byte counts);
checking a request against a model's signature is `edged.wire.signature`'s job. The
messages themselves are edged.wire.messages'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

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
from edged.wire.shm import SHM_OPS, ShmTensor, input_entries, read_outputs_shm, read_ref, read_shm_op, write_region
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
    header = _unpack_header(frames[0], limits)
    request_id = _request_id(header)
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
    request.deadline_ms = _deadline(header, request_id)
    request.inputs, request.shm_inputs = _input_specs(header, len(frames) - 1, limits, request_id)
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
    request.outputs = _output_names(header, request_id)
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


def _unpack_header(frame: Buffer, limits: Limits) -> dict[str, Any]:
    if len(frame) > limits.max_header_bytes:
        raise ProtocolError(
            Status.INVALID_ARGUMENT,
            f"header is {len(frame)} bytes, over the limit of {limits.max_header_bytes}",
        )
    try:
        header = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise ProtocolError(Status.INVALID_ARGUMENT, f"header is not valid msgpack ({exc})") from None
    if not isinstance(header, dict):
        raise ProtocolError(Status.INVALID_ARGUMENT, f"header must be a msgpack map, got {type(header).__name__}")
    return header


def _request_id(header: dict[str, Any]) -> RequestId:
    if "id" not in header:
        raise ProtocolError(Status.INVALID_ARGUMENT, "header has no 'id'")
    request_id = header["id"]
    if isinstance(request_id, bool) or not isinstance(request_id, (int, str, bytes)):
        raise ProtocolError(
            Status.INVALID_ARGUMENT, f"'id' must be an int, str or bin, got {type(request_id).__name__}"
        )
    size = (
        len(request_id.encode())
        if isinstance(request_id, str)
        else (len(request_id) if isinstance(request_id, bytes) else 0)
    )
    if size > MAX_ID_BYTES:
        raise ProtocolError(Status.INVALID_ARGUMENT, f"'id' is {size} bytes, over the limit of {MAX_ID_BYTES}")
    return request_id


def _deadline(header: dict[str, Any], request_id: RequestId) -> float | None:
    deadline = header.get("deadline_ms")
    if deadline is None:
        return None
    if (
        isinstance(deadline, bool)
        or not isinstance(deadline, (int, float))
        or not (math.isfinite(deadline) and deadline > 0)
    ):
        raise ProtocolError(
            Status.INVALID_ARGUMENT, f"'deadline_ms' must be a finite number > 0, got {deadline!r}", request_id
        )
    # Budgets past an hour mean "no hurry"; capping them keeps the clock arithmetic finite.
    return min(float(deadline), MAX_DEADLINE_MS)


def _input_specs(
    header: dict[str, Any], n_payloads: int, limits: Limits, request_id: RequestId
) -> tuple[list[TensorSpec], dict[str, ShmRef]]:
    def bad(message: str) -> ProtocolError:
        return ProtocolError(Status.INVALID_ARGUMENT, message, request_id)

    raw = header.get("inputs")
    if not isinstance(raw, list) or not raw:
        raise bad("op 'infer' needs 'inputs', a non-empty list of {name, dtype, shape} maps")
    if len(raw) > limits.max_tensors:
        raise bad(f"{len(raw)} inputs, over the limit of {limits.max_tensors}")
    framed = sum(not (isinstance(item, dict) and "shm" in item) for item in raw)
    if framed != n_payloads:
        sent_as = " sent as frames" if framed != len(raw) else ""
        raise bad(f"'inputs' describes {framed} tensors{sent_as} but {n_payloads} payload frames came")
    specs, refs = [], {}
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise bad(f"inputs[{i}] must be a map with name, dtype and shape")
        name, dtype, shape = item.get("name"), item.get("dtype"), item.get("shape")
        if not isinstance(name, str):
            raise bad(f"inputs[{i}].name must be a string")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise bad(f"input {name!r}: unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise bad(f"input {name!r}: shape must be a list of non-negative ints, got {shape!r}")
        # Python ints do not overflow: an absurd shape is refused here, before any allocation.
        # The zero dimensions are left out of the count, since NumPy refuses a shape such as
        # [0, 2**31, 2**31] as too big even though it holds nothing.
        elements = math.prod(d for d in shape if d)
        if elements > limits.max_tensor_elements:
            raise bad(
                f"input {name!r}: shape {shape} spans {elements} elements, "
                f"over the limit of {limits.max_tensor_elements}"
            )
        specs.append(TensorSpec(name, dtype, tuple(shape)))
        if "shm" in item:
            refs[name] = read_ref(item["shm"], f"input {name!r}: shm", request_id)
    return specs, refs


def _output_names(header: dict[str, Any], request_id: RequestId) -> list[str] | None:
    names = header.get("outputs")
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ProtocolError(Status.INVALID_ARGUMENT, "'outputs' must be a list of output names", request_id)
    return names


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
