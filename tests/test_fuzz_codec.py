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

from edged.wire.codec import (
    DTYPES,
    MAX_ID_BYTES,
    OPS,
    Limits,
    ProtocolError,
    Status,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
    tensor_views,
)

# msgpack's own integer range: what any client can put in an `id`.
ids = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.text(max_size=MAX_ID_BYTES).filter(lambda s: len(s.encode()) <= MAX_ID_BYTES),
    st.binary(max_size=MAX_ID_BYTES),
)
names = st.text(min_size=1, max_size=12)
shapes = st.lists(st.integers(min_value=0, max_value=5), min_size=0, max_size=4)
# Plain numpy dtypes only: ml_dtypes' types have no big-endian form to test the swap with.
SWAPPABLE = [name for name in DTYPES if DTYPES[name].kind in "iuf" and DTYPES[name].type.__module__ == "numpy"]


@st.composite
def tensors(draw: st.DrawFn) -> np.ndarray:
    """A tensor of any wire dtype with arbitrary bytes (NaNs and all), sometimes
    non-contiguous or big endian: the encoder must send its values, C order, little endian."""
    dtype_name = draw(st.sampled_from(list(DTYPES)))
    dtype = DTYPES[dtype_name]
    shape = tuple(draw(shapes))
    raw = draw(st.binary(min_size=math.prod(shape) * dtype.itemsize, max_size=math.prod(shape) * dtype.itemsize))
    array = np.frombuffer(raw, dtype=np.uint8)
    if dtype_name == "bool":
        array = array & 1  # a bool byte other than 0 or 1 is not a bool numpy can round-trip
    array = array.view(dtype).reshape(shape)
    if array.ndim >= 2 and draw(st.booleans()):
        array = array.T  # Fortran order: encode must copy to C order
    if dtype_name in SWAPPABLE and dtype.itemsize > 1 and draw(st.booleans()):
        array = array.astype(dtype.newbyteorder(">"))
    return array


tensor_maps = st.dictionaries(names, tensors(), min_size=1, max_size=4)


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


@given(request_id=ids, op=st.sampled_from([op for op in OPS if op != "infer"]), klass=st.none() | names)
def test_control_request_round_trips(request_id: Any, op: str, klass: str | None) -> None:
    request = decode_request(over_the_wire(encode_request(request_id, op, klass=klass)))
    assert (request.id, request.op, request.klass, request.inputs) == (request_id, op, klass, [])


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


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


# Every msgpack type, nested: what a hostile client can put in any header slot.
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=12))
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(scalars.filter(_hashable), inner, max_size=4),
    max_leaves=12,
)


LIMITS = Limits(max_header_bytes=4096, max_tensors=4, max_tensor_elements=4096)
VALID_INFER = {
    "v": 1,
    "id": "fuzz",
    "op": "infer",
    "model": "mlp-light",
    "class": "standard",
    "deadline_ms": 50.0,
    "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 64]}],
    "outputs": ["scores"],
}
SPEC_KEYS = ("name", "dtype", "shape")


@st.composite
def mutated_headers(draw: st.DrawFn) -> dict[Any, Any]:
    """A valid infer header with a few keys dropped, replaced or added, at the top or
    inside an input spec: garbage that gets past the msgpack layer."""
    header = {**VALID_INFER, "inputs": [dict(spec) for spec in VALID_INFER["inputs"]]}
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["drop", "replace", "add", "spec", "shape", "more inputs"]))
        key = draw(st.sampled_from(list(VALID_INFER)))
        if action == "drop":
            header.pop(key, None)
        elif action == "replace":
            header[key] = draw(values)
        elif action == "add":
            header[draw(scalars.filter(_hashable))] = draw(values)
        elif isinstance(header.get("inputs"), list) and header["inputs"] and isinstance(header["inputs"][0], dict):
            spec = header["inputs"][0]
            if action == "spec":
                spec[draw(st.sampled_from(SPEC_KEYS))] = draw(values)
            elif action == "shape":
                spec["shape"] = draw(st.lists(st.integers(-(2**63), 2**64 - 1) | st.integers(0, 70), max_size=6))
            else:
                header["inputs"] = header["inputs"] * draw(st.integers(2, 6))
    return header


payload_frames = st.lists(st.binary(max_size=300), max_size=6)


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
