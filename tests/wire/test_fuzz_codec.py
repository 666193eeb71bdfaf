"""Property tests of the pure codec: whatever valid request or reply is encoded comes
back the same, and whatever bytes arrive, decode_request either returns a request
whose payloads fit its specs or raises ProtocolError, never anything else."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.codec_strategies import (
    LIMITS,
    VALID_INFER,
    ids,
    mutated_headers,
    names,
    payload_frames,
    tensor_maps,
    values,
)

from edged.wire.codec import (
    DTYPES,
    OPS,
    ProtocolError,
    ShmRef,
    Status,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
    tensor_views,
)
from edged.wire.shm import NAME, SHM_OPS


def same_bytes(actual: np.ndarray, expected: np.ndarray) -> None:
    """Bitwise equality in the wire's byte order: NaN payloads and -0.0 must survive too."""
    assert actual.shape == expected.shape
    wire = expected.astype(expected.dtype.newbyteorder("<"))
    assert np.ascontiguousarray(actual).tobytes() == np.ascontiguousarray(wire).tobytes()


def over_the_wire(frames: list[Any]) -> list[bytes]:
    return [bytes(frame) for frame in frames]


@given(
    request_id=ids,
    model=names,
    klass=st.none() | names,
    deadline=st.none() | st.floats(min_value=1e-3, max_value=1e6),
    inputs=tensor_maps,
    outputs=st.none() | st.lists(names, max_size=3),
)
@settings(max_examples=150, deadline=None)
def test_infer_request_round_trips(
    request_id: Any,
    model: str,
    klass: str | None,
    deadline: float | None,
    inputs: dict[str, np.ndarray],
    outputs: list[str] | None,
) -> None:
    frames = encode_request(request_id, model=model, klass=klass, deadline_ms=deadline, inputs=inputs, outputs=outputs)
    request = decode_request(over_the_wire(frames))
    assert request.id == request_id and type(request.id) is type(request_id)
    assert (request.op, request.model, request.klass, request.deadline_ms) == ("infer", model, klass, deadline)
    assert request.outputs == outputs
    views = tensor_views(request)
    assert list(views) == list(inputs)
    for name, array in inputs.items():
        wire_dtype = array.dtype.newbyteorder("<")
        assert DTYPES[request.inputs[list(inputs).index(name)].dtype].newbyteorder("<") == wire_dtype
        same_bytes(views[name], array)


@given(request_id=ids, op=st.sampled_from([op for op in OPS if op not in ("infer", *SHM_OPS)]), klass=st.none() | names)
def test_control_request_round_trips(request_id: Any, op: str, klass: str | None) -> None:
    request = decode_request(over_the_wire(encode_request(request_id, op, klass=klass)))
    assert (request.id, request.op, request.klass, request.inputs) == (request_id, op, klass, [])


@given(
    request_id=ids,
    op=st.sampled_from(SHM_OPS),
    name=st.from_regex(NAME, fullmatch=True),
    nbytes=st.integers(1, 2**40),
)
def test_region_request_round_trips(request_id: Any, op: str, name: str, nbytes: int) -> None:
    request = decode_request(over_the_wire(encode_request(request_id, op, region=ShmRef(name, 0, nbytes))))
    expected = ShmRef(name, 0, nbytes if op == "shm_register" else 0)
    assert (request.id, request.op, request.region, request.inputs) == (request_id, op, expected, [])


@given(
    request_id=st.none() | ids,
    status=st.sampled_from(list(Status)),
    error=st.none() | st.text(max_size=80),
    outputs=st.none() | tensor_maps,
    timing=st.fixed_dictionaries({k: st.integers(0, 2**40) for k in ("queue", "compute", "total")}),
    retry=st.none() | st.floats(min_value=0, max_value=1e6),
)
@settings(max_examples=150, deadline=None)
def test_reply_round_trips(
    request_id: Any,
    status: Status,
    error: str | None,
    outputs: dict[str, np.ndarray] | None,
    timing: dict[str, int],
    retry: float | None,
) -> None:
    extra = {"timing_us": timing} if retry is None else {"timing_us": timing, "retry_after_ms": retry}
    reply = decode_reply(over_the_wire(encode_reply(request_id, status, error=error, outputs=outputs, **extra)))
    assert reply.id == request_id and reply.status is status
    assert reply.error == (error or "")
    assert reply.header["timing_us"] == timing and reply.header.get("retry_after_ms") == retry
    # Outputs are a promise of OK replies only; the decoder ignores them elsewhere.
    expected = outputs if status is Status.OK and outputs is not None else {}
    assert list(reply.outputs) == list(expected)
    for name, array in expected.items():
        same_bytes(reply.outputs[name], array)


# --- hostile input ------------------------------------------------------------


def decodes_or_refuses(frames: list[bytes]) -> None:
    """The property: a ProtocolError or a request whose payloads exactly fit its specs."""
    try:
        request = decode_request(frames, LIMITS)
    except ProtocolError as exc:
        assert isinstance(exc.status, Status) and exc.status is not Status.OK
        assert exc.message
        return
    assert request.op in OPS
    for spec, view in zip(request.inputs, tensor_views(request).values()):
        assert view.shape == spec.shape and math.prod(spec.shape) <= LIMITS.max_tensor_elements


@given(frames=st.lists(st.binary(max_size=200), max_size=5))
@settings(max_examples=300)
def test_arbitrary_bytes_only_ever_raise_protocol_error(frames: list[bytes]) -> None:
    decodes_or_refuses(frames)


@given(header=values, payloads=payload_frames)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_arbitrary_msgpack_headers_only_ever_raise_protocol_error(header: Any, payloads: list[bytes]) -> None:
    decodes_or_refuses([msgpack.packb(header), *payloads])


@given(header=mutated_headers(), payloads=payload_frames, cut=st.none() | st.integers(0, 200))
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_mutated_valid_headers_only_ever_raise_protocol_error(
    header: dict[Any, Any], payloads: list[bytes], cut: int | None
) -> None:
    packed = msgpack.packb(header)
    decodes_or_refuses([packed[:cut] if cut is not None else packed, *payloads])


@given(payload=st.binary(min_size=0, max_size=600))
def test_a_mutated_payload_length_is_refused_unless_it_fits(payload: bytes) -> None:
    """Random payload lengths for a fixed valid header: exactly 256 bytes is served."""
    frames = [msgpack.packb(VALID_INFER), payload]
    if len(payload) == 256:
        assert len(tensor_views(decode_request(frames, LIMITS))["x"].ravel()) == 64
    else:
        try:
            decode_request(frames, LIMITS)
        except ProtocolError as exc:
            assert exc.status is Status.INVALID_ARGUMENT and exc.request_id == "fuzz"
        else:
            raise AssertionError(f"a {len(payload)}-byte payload for a 256-byte tensor was accepted")
