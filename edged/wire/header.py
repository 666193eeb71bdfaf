"""A request header's fields, each read and checked alone (edged.wire.codec puts them
together): structure only, with a ProtocolError that names the field and the fix."""

from __future__ import annotations

import math
from typing import Any

import msgpack

from edged.wire.messages import (
    MAX_DEADLINE_MS,
    MAX_ID_BYTES,
    Buffer,
    Limits,
    ProtocolError,
    RequestId,
    ShmRef,
    Status,
    TensorSpec,
)
from edged.wire.shm import read_ref
from edged.wire.tensors import DTYPES

# A header over the size limit is not read, but its id is looked for in this many bytes at its
# start (where edged's clients put it), so that the refusal reaches its call: with a nil id, a
# client with several calls out on one socket cannot tell whose it is.
ID_PREFIX_BYTES = 128

# What msgpack's wordless errors mean, in words for the client.
_UNSAID = {
    msgpack.exceptions.StackError: "nested deeper than msgpack's unpacker allows",
    msgpack.exceptions.FormatError: "byte 0xc1, which msgpack never uses",
}


def unpack_header(frame: Buffer, limits: Limits) -> dict[str, Any]:
    """The header frame as a map, within `limits.max_header_bytes`."""
    if len(frame) > limits.max_header_bytes:
        raise ProtocolError(
            Status.INVALID_ARGUMENT,
            f"header is {len(frame)} bytes, over the limit of {limits.max_header_bytes}",
            _id_at_start(frame),
        )
    try:
        header = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for garbage, two of them without words
        why = str(exc) or _UNSAID.get(type(exc), type(exc).__name__)
        raise ProtocolError(Status.INVALID_ARGUMENT, f"header is not valid msgpack ({why})") from None
    if not isinstance(header, dict):
        raise ProtocolError(Status.INVALID_ARGUMENT, f"header must be a msgpack map, got {type(header).__name__}")
    return header


def _id_at_start(frame: Buffer) -> RequestId:
    """The header's id if a valid one lies within its first ID_PREFIX_BYTES; else None."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(bytes(memoryview(frame)[:ID_PREFIX_BYTES]))
    try:
        for _ in range(unpacker.read_map_header()):
            if unpacker.unpack() == "id":
                return request_id_of({"id": unpacker.unpack()})
            unpacker.skip()
    except Exception:  # cut short by the prefix's end, not a map, or an id that is not one: None
        return None
    return None


def request_id_of(header: dict[str, Any]) -> RequestId:
    """The request's id: an int, str or bin, at most MAX_ID_BYTES long."""
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


def deadline_of(header: dict[str, Any], request_id: RequestId) -> float | None:
    """`deadline_ms`, if given: a finite number > 0, capped at MAX_DEADLINE_MS."""
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


def input_specs(
    header: dict[str, Any], n_payloads: int, limits: Limits, request_id: RequestId
) -> tuple[list[TensorSpec], dict[str, ShmRef]]:
    """The inputs' specs, checked against `limits` and the `n_payloads` frames that came,
    and the references of those held in the client's shared memory."""

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


def output_names_of(header: dict[str, Any], request_id: RequestId) -> list[str] | None:
    """The outputs asked for by name; None: all of them."""
    names = header.get("outputs")
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ProtocolError(Status.INVALID_ARGUMENT, "'outputs' must be a list of output names", request_id)
    return names
