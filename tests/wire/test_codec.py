"""The wire codec alone, without sockets: what goes on the wire, what comes back, and
the error each malformed request is refused with."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import msgpack
import numpy as np
import pytest

from edged.wire.codec import (
    DTYPES,
    Limits,
    ProtocolError,
    Status,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
    tensor_views,
)

# Values that exercise each dtype's corners: signs, extremes, specials where the type has them.
SAMPLES: dict[str, np.ndarray] = {
    "float32": np.array([[0.0, -1.5, 3.4e38], [np.inf, -np.inf, np.nan]], dtype=np.float32),
    "float16": np.array([[0.0, -2.0, 65504.0], [np.inf, np.nan, 6e-8]], dtype=np.float16),
    "bfloat16": np.array([[0.0, -1.0, 3.0e38], [np.inf, np.nan, 1e-30]], dtype=ml_dtypes.bfloat16),
    "float8_e4m3fn": np.array([[0.0, -1.0, 448.0], [-448.0, np.nan, 0.015625]], dtype=ml_dtypes.float8_e4m3fn),
    "int8": np.array([[-128, 0, 127]], dtype=np.int8),
    "uint8": np.array([[0, 1, 255]], dtype=np.uint8),
    "int32": np.array([[-(2**31), 0, 2**31 - 1]], dtype=np.int32),
    "int64": np.array([[-(2**63), 0, 2**63 - 1]], dtype=np.int64),
    "bool": np.array([[True, False, True]], dtype=np.bool_),
}


def wire(frames: list[Any]) -> list[bytes]:
    """What a receiver holds: plain bytes, not the sender's views."""
    return [bytes(frame) for frame in frames]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    # NaN != NaN, so compare the bytes: the wire must not change a single bit.
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_every_wire_dtype_has_a_sample() -> None:
    assert set(SAMPLES) == set(DTYPES)


@pytest.mark.parametrize("dtype", list(SAMPLES))
def test_request_round_trip_keeps_every_bit(dtype: str) -> None:
    array = SAMPLES[dtype]
    frames = wire(encode_request(41, model="m", inputs={"t": array}))
    request = decode_request(frames)
    assert request.inputs[0].dtype == dtype
    assert request.inputs[0].shape == array.shape
    assert same_bits(tensor_views(request)["t"], array)


@pytest.mark.parametrize("dtype", list(SAMPLES))
def test_reply_round_trip_keeps_every_bit(dtype: str) -> None:
    array = SAMPLES[dtype]
    frames = wire(encode_reply("r", Status.OK, outputs={"out": array}, timing_us={"queue": 1}))
    reply = decode_reply(frames)
    assert reply.id == "r"
    assert reply.status is Status.OK
    assert reply.header["timing_us"] == {"queue": 1}
    assert same_bits(reply.outputs["out"], array)


def test_request_header_carries_every_field_given() -> None:
    x = np.zeros((2, 3), dtype=np.float32)
    frames = encode_request(
        b"\x00id", model="mlp", klass="realtime", deadline_ms=2.5, inputs={"x": x}, outputs=["scores"]
    )
    assert msgpack.unpackb(frames[0]) == {
        "v": 1,
        "id": b"\x00id",
        "op": "infer",
        "model": "mlp",
        "class": "realtime",
        "deadline_ms": 2.5,
        "outputs": ["scores"],
        "inputs": [{"name": "x", "dtype": "float32", "shape": [2, 3]}],
    }
    assert len(frames) == 2 and len(frames[1]) == x.nbytes


def test_control_request_has_no_payload_frames() -> None:
    frames = encode_request(5, "health")
    assert len(frames) == 1
    request = decode_request(wire(frames))
    assert (request.id, request.op) == (5, "health")


def test_payload_is_little_endian_c_order_whatever_the_array() -> None:
    values = np.arange(12, dtype=np.int32).reshape(3, 4)
    big_endian_transposed = values.astype(">i4").T  # neither little endian nor C contiguous
    frames = encode_request(1, model="m", inputs={"t": big_endian_transposed})
    assert bytes(frames[1]) == np.ascontiguousarray(values.T).astype("<i4").tobytes()
    assert (tensor_views(decode_request(wire(frames)))["t"] == values.T).all()


def test_tensor_views_are_views_of_the_received_frames() -> None:
    payload = bytearray(np.zeros(4, dtype=np.float32).tobytes())
    frames = [
        msgpack.packb({"v": 1, "id": 1, "model": "m", "inputs": [{"name": "t", "dtype": "float32", "shape": [4]}]})
    ]
    view = tensor_views(decode_request([*frames, payload]))["t"]
    payload[:4] = np.float32(7.0).tobytes()
    assert view[0] == 7.0  # no copy was made on the way in


def test_dtype_the_wire_cannot_carry_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="float64"):
        encode_request(1, model="m", inputs={"t": np.zeros(2, dtype=np.float64)})
    with pytest.raises(ValueError, match="float64"):
        encode_reply(1, Status.OK, outputs={"t": np.zeros(2, dtype=np.float64)})


def test_error_reply_round_trip() -> None:
    reply = decode_reply(wire(encode_reply(None, Status.OVERLOADED, error="busy", retry_after_ms=1.5)))
    assert reply.id is None
    assert reply.status is Status.OVERLOADED
    assert reply.error == "busy"
    assert reply.header["retry_after_ms"] == 1.5
    assert reply.outputs == {}


@pytest.mark.parametrize("request_id", [0, -1, 2**63 - 1, -(2**63), "", "é" * 32, b"\xff" * 64])
def test_every_valid_id_is_read_back_unchanged(request_id: int | str | bytes) -> None:
    request = decode_request(wire(encode_request(request_id, "health")))
    assert request.id == request_id and type(request.id) is type(request_id)


# --- decode errors --------------------------------------------------------------


def infer_header(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "v": 1,
        "id": 9,
        "op": "infer",
        "model": "m",
        "inputs": [{"name": "x", "dtype": "float32", "shape": [2, 2]}],
    }
    fields.update(changes)
    return {k: v for k, v in fields.items() if v is not REMOVE}


REMOVE = object()
PAYLOAD = b"\0" * 16  # [2, 2] float32


def spec(**changes: Any) -> list[dict[str, Any]]:
    return [{"name": "x", "dtype": "float32", "shape": [2, 2], **changes}]


# (frames, status, phrase in the message, id the error carries)
DECODE_ERRORS: dict[str, tuple[list[bytes], Status, str, Any]] = {
    "no frames": ([], Status.INVALID_ARGUMENT, "empty message", None),
    "header over the limit": (
        [msgpack.packb({"v": 1, "id": 1, "pad": "a" * 70_000})],
        Status.INVALID_ARGUMENT,
        "over the limit",
        1,  # read from the header's first bytes
    ),
    "not msgpack": ([b"\xc1\xc1"], Status.INVALID_ARGUMENT, "not valid msgpack (byte 0xc1", None),
    "nested too deep": (
        [b"\x84\xa1v\x01\xa2id\x01\xa2op\xa6health\xa1z" + b"\x91" * 60_000 + b"\xc0"],
        Status.INVALID_ARGUMENT,
        "not valid msgpack (nested deeper than",
        None,
    ),
    "truncated msgpack": ([msgpack.packb({"v": 1, "id": 1})[:-1]], Status.INVALID_ARGUMENT, "not valid msgpack", None),
    "empty header frame": ([b""], Status.INVALID_ARGUMENT, "not valid msgpack", None),
    "not a map": ([msgpack.packb([1, 2])], Status.INVALID_ARGUMENT, "must be a msgpack map", None),
    "no id": ([msgpack.packb({"v": 1, "op": "health"})], Status.INVALID_ARGUMENT, "no 'id'", None),
    "nil id": ([msgpack.packb({"v": 1, "id": None})], Status.INVALID_ARGUMENT, "'id' must be", None),
    "float id": ([msgpack.packb({"v": 1, "id": 1.5})], Status.INVALID_ARGUMENT, "'id' must be", None),
    "bool id": ([msgpack.packb({"v": 1, "id": True})], Status.INVALID_ARGUMENT, "'id' must be", None),
    "list id": ([msgpack.packb({"v": 1, "id": [1]})], Status.INVALID_ARGUMENT, "'id' must be", None),
    "str id over 64 bytes": ([msgpack.packb({"v": 1, "id": "a" * 65})], Status.INVALID_ARGUMENT, "64", None),
    "str id over 64 bytes in utf-8": ([msgpack.packb({"v": 1, "id": "é" * 33})], Status.INVALID_ARGUMENT, "64", None),
    "bin id over 64 bytes": ([msgpack.packb({"v": 1, "id": b"a" * 65})], Status.INVALID_ARGUMENT, "64", None),
    "version 2": ([msgpack.packb({"v": 2, "id": 3})], Status.INVALID_ARGUMENT, "version", 3),
    "no version": ([msgpack.packb({"id": 3})], Status.INVALID_ARGUMENT, "version", 3),
    "unknown op": ([msgpack.packb({"v": 1, "id": 3, "op": "reboot"})], Status.NOT_FOUND, "unknown op", 3),
    "class not a string": (
        [msgpack.packb({"v": 1, "id": 3, "op": "health", "class": 1})],
        Status.INVALID_ARGUMENT,
        "'class'",
        3,
    ),
    "control op with payload": (
        [msgpack.packb({"v": 1, "id": 3, "op": "stats"}), b"x"],
        Status.INVALID_ARGUMENT,
        "no payload",
        3,
    ),
    "no model": ([msgpack.packb(infer_header(model=REMOVE)), PAYLOAD], Status.INVALID_ARGUMENT, "'model'", 9),
    "model not a string": ([msgpack.packb(infer_header(model=["m"])), PAYLOAD], Status.INVALID_ARGUMENT, "'model'", 9),
    "zero deadline": ([msgpack.packb(infer_header(deadline_ms=0)), PAYLOAD], Status.INVALID_ARGUMENT, "deadline_ms", 9),
    "negative deadline": (
        [msgpack.packb(infer_header(deadline_ms=-5.0)), PAYLOAD],
        Status.INVALID_ARGUMENT,
        "deadline_ms",
        9,
    ),
    "infinite deadline": (
        [msgpack.packb(infer_header(deadline_ms=float("inf"))), PAYLOAD],
        Status.INVALID_ARGUMENT,
        "deadline_ms",
        9,
    ),
    "nan deadline": (
        [msgpack.packb(infer_header(deadline_ms=float("nan"))), PAYLOAD],
        Status.INVALID_ARGUMENT,
        "deadline_ms",
        9,
    ),
    "string deadline": (
        [msgpack.packb(infer_header(deadline_ms="5")), PAYLOAD],
        Status.INVALID_ARGUMENT,
        "deadline_ms",
        9,
    ),
    "bool deadline": (
        [msgpack.packb(infer_header(deadline_ms=True)), PAYLOAD],
        Status.INVALID_ARGUMENT,
        "deadline_ms",
        9,
    ),
    "no inputs": ([msgpack.packb(infer_header(inputs=REMOVE))], Status.INVALID_ARGUMENT, "'inputs'", 9),
    "empty inputs": ([msgpack.packb(infer_header(inputs=[]))], Status.INVALID_ARGUMENT, "'inputs'", 9),
    "inputs not a list": (
        [msgpack.packb(infer_header(inputs={"x": 1})), PAYLOAD],
        Status.INVALID_ARGUMENT,
        "'inputs'",
        9,
    ),
    "too many inputs": (
        [
            msgpack.packb(infer_header(inputs=[{"name": f"x{i}", "dtype": "uint8", "shape": [1]} for i in range(17)])),
            *[b"\0"] * 17,
        ],
        Status.INVALID_ARGUMENT,
        "over the limit",
        9,
    ),
    # Found by the codec fuzzer: zero elements, yet NumPy refused the shape as too big (a ValueError).
    "empty tensor with huge dimensions": (
        [
            msgpack.packb(
                infer_header(inputs=[{"name": "x", "dtype": "float32", "shape": [0, 1518494220, 1518506280]}])
            ),
            b"",
        ],
        Status.INVALID_ARGUMENT,
        "over the limit",
        9,
    ),
    "missing payload frame": ([msgpack.packb(infer_header())], Status.INVALID_ARGUMENT, "payload frames", 9),
    "extra payload frame": (
        [msgpack.packb(infer_header()), PAYLOAD, PAYLOAD],
        Status.INVALID_ARGUMENT,
        "payload frames",
        9,
    ),
    "input not a map": ([msgpack.packb(infer_header(inputs=["x"])), PAYLOAD], Status.INVALID_ARGUMENT, "inputs[0]", 9),
    "input name not a string": (
        [msgpack.packb(infer_header(inputs=spec(name=1))), PAYLOAD],
        Status.INVALID_ARGUMENT,
        "name",
        9,
    ),
    "unknown dtype": (
        [msgpack.packb(infer_header(inputs=spec(dtype="float64"))), PAYLOAD],
        Status.INVALID_ARGUMENT,
        "unknown dtype",
        9,
    ),
    "dtype not a string": (
        [msgpack.packb(infer_header(inputs=spec(dtype=["float32"]))), PAYLOAD],
        Status.INVALID_ARGUMENT,
        "dtype",
        9,
    ),
    "dtype a map": (
        [msgpack.packb(infer_header(inputs=spec(dtype={"n": 1}))), PAYLOAD],
        Status.INVALID_ARGUMENT,
        "dtype",
        9,
    ),
    "shape not a list": (
        [msgpack.packb(infer_header(inputs=spec(shape=4))), PAYLOAD],
        Status.INVALID_ARGUMENT,
        "shape",
        9,
    ),
    "negative dimension": (
        [msgpack.packb(infer_header(inputs=spec(shape=[-1, 4]))), PAYLOAD],
        Status.INVALID_ARGUMENT,
        "shape",
        9,
    ),
    "float dimension": (
        [msgpack.packb(infer_header(inputs=spec(shape=[2.0, 2]))), PAYLOAD],
        Status.INVALID_ARGUMENT,
        "shape",
        9,
    ),
    "bool dimension": (
        [msgpack.packb(infer_header(inputs=spec(shape=[True, 4]))), PAYLOAD],
        Status.INVALID_ARGUMENT,
        "shape",
        9,
    ),
    "absurd shape": (
        [msgpack.packb(infer_header(inputs=spec(shape=[2**40, 2**40]))), b"\0" * 4],
        Status.INVALID_ARGUMENT,
        "over the limit",
        9,
    ),
    "too few bytes": ([msgpack.packb(infer_header()), PAYLOAD[:-1]], Status.INVALID_ARGUMENT, "15 bytes", 9),
    "too many bytes": ([msgpack.packb(infer_header()), PAYLOAD + b"\0"], Status.INVALID_ARGUMENT, "17 bytes", 9),
    "outputs not a list": (
        [msgpack.packb(infer_header(outputs="y")), PAYLOAD],
        Status.INVALID_ARGUMENT,
        "'outputs'",
        9,
    ),
    "outputs not strings": (
        [msgpack.packb(infer_header(outputs=[1])), PAYLOAD],
        Status.INVALID_ARGUMENT,
        "'outputs'",
        9,
    ),
}


@pytest.mark.parametrize("case", list(DECODE_ERRORS))
def test_malformed_request_is_refused_with_status_message_and_id(case: str) -> None:
    frames, status, phrase, request_id = DECODE_ERRORS[case]
    with pytest.raises(ProtocolError) as caught:
        decode_request(frames)
    assert caught.value.status is status
    assert phrase in caught.value.message
    assert caught.value.request_id == request_id


def test_limits_are_the_callers() -> None:
    frames = wire(encode_request(1, model="m", inputs={"x": np.zeros((4, 4), dtype=np.uint8)}))
    decode_request(frames)  # within the default limits
    with pytest.raises(ProtocolError, match="over the limit of 8"):
        decode_request(frames, Limits(max_tensor_elements=8))
    with pytest.raises(ProtocolError, match="over the limit of 4"):
        decode_request(frames, Limits(max_header_bytes=4))


@pytest.mark.parametrize(
    ("header", "request_id"),
    [
        ({"v": 1, "id": "a-call", "pad": "x" * 500}, "a-call"),  # as edged's clients write it
        ({"pad": "x" * 200, "id": 7}, None),  # past the first 128 bytes: not looked for
        ({"v": 1, "id": 1.5, "pad": "x" * 500}, None),  # not an id
        ({"v": 1, "pad": "x" * 500}, None),
    ],
)
def test_a_header_over_the_limit_is_refused_with_its_id_when_it_starts_the_header(
    header: dict[str, Any], request_id: object
) -> None:
    """Refused with a nil id, a hedged call's two copies' refusals could not be told from another
    call's (a client flake): the id is looked for at the start of a header not otherwise read."""
    with pytest.raises(ProtocolError, match="over the limit of 100") as caught:
        decode_request([msgpack.packb(header)], Limits(max_header_bytes=100))
    assert caught.value.request_id == request_id


def test_largest_allowed_tensor_passes_structure_check() -> None:
    # The element limit is inclusive: exactly max_tensor_elements is a valid request.
    limits = Limits(max_tensor_elements=16)
    frames = wire(encode_request(1, model="m", inputs={"x": np.zeros((4, 4), dtype=np.uint8)}))
    assert decode_request(frames, limits).inputs[0].shape == (4, 4)


@pytest.mark.parametrize("version", [True, 1.0, "1"])
def test_a_version_that_only_compares_equal_to_1_is_refused(version) -> None:
    header = msgpack.packb({"v": version, "id": 5, "op": "health"})
    with pytest.raises(ProtocolError, match="unsupported protocol version") as refused:
        decode_request([header])
    assert refused.value.status is Status.INVALID_ARGUMENT
    assert refused.value.request_id == 5
