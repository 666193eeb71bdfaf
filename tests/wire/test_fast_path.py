"""The fast path (edged.wire.fast, Signature's quick check) against the checked path it
stands in front of: whatever the fast path accepts, the checked path accepts the same
way, and whatever the checked path refuses, the fast path hands over to it.

Differential properties: the checked path is the specification, already fuzzed in
test_fuzz_codec; these tests say the fast path never disagrees with it.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.codec_strategies import LIMITS, VALID_INFER, mutated_headers, tensors, values

from edged.wire import fast
from edged.wire.codec import (
    ProtocolError,
    Request,
    Status,
    TensorSpec,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)
from edged.wire.signature import Signature


def checked(frames: list[bytes]) -> Request | None:
    try:
        return decode_request(frames, LIMITS)
    except ProtocolError:
        return None


def agrees(frames: list[bytes]) -> Request | None:
    """The property: the fast path gives None, or exactly the checked path's request."""
    quick = fast.decode_request(frames, LIMITS)
    if quick is not None:
        assert quick == checked(frames), (quick, checked(frames))
    return quick


# A payload that fits the valid header's one input most of the time, so that the
# mutated headers reach every rule past the msgpack layer.
fitting = st.one_of(st.just([b"\0" * 256]), st.lists(st.binary(max_size=300), max_size=3))


@given(header=mutated_headers(), payloads=fitting)
@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
def test_the_fast_decode_accepts_only_what_the_checked_decode_accepts_alike(
    header: dict[Any, Any], payloads: list[bytes]
) -> None:
    agrees([msgpack.packb(header), *payloads])


@given(header=values, payloads=st.lists(st.binary(max_size=64), max_size=3))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_the_fast_decode_hands_any_msgpack_it_cannot_take_to_the_checked_path(
    header: Any, payloads: list[bytes]
) -> None:
    agrees([msgpack.packb(header), *payloads])


@given(
    request_id=st.integers(-(2**63), 2**64 - 1) | st.text(max_size=70) | st.binary(max_size=70),
    deadline=st.none() | st.integers(-5, 10**8) | st.floats(allow_nan=True, allow_infinity=True),
    klass=st.none() | st.text(max_size=8),
)
@settings(max_examples=300)
def test_ids_deadlines_and_classes_are_read_alike(request_id: Any, deadline: Any, klass: Any) -> None:
    header = {**VALID_INFER, "id": request_id, "deadline_ms": deadline, "class": klass}
    agrees([msgpack.packb(header), b"\0" * 256])


# A key the header does not define, and after it what msgpack.packb never writes: a str of
# invalid UTF-8, a map keyed by an array, a timestamp of 2 bytes (a review's differential fuzz).
POISONED = [b"\xa2zz\xa2\xff\xfe", b"\xa2\xff\xfe\x00", b"\xa2zz\x81\x91\x00\x01", b"\xa2zz\xd5\xff\x00\x00"]


def test_what_the_fast_decode_skips_unread_under_an_unknown_key_is_still_refused() -> None:
    """msgspec skips the value of a key the struct does not declare without checking it: the
    fast path served an infer (and a health) whose header the checked path refuses as not
    valid msgpack, so that the same header was served or refused by what else it held."""
    infer, health = dict(VALID_INFER), {"v": 1, "id": 1, "op": "health"}
    for base, payloads in ((infer, [b"\0" * 256]), (health, [])):
        packed = msgpack.packb(base)
        assert packed[0] == 0x80 + len(base)  # a fixmap: one more entry is one more to its count
        for poison in POISONED:
            frames = [bytes([packed[0] + 1]) + packed[1:] + poison, *payloads]
            assert checked(frames) is None
            assert agrees(frames) is None, poison


def test_the_common_request_takes_the_fast_path() -> None:
    """Not only agreement: a plain request from the client library is decoded there."""
    x = np.arange(64, dtype=np.float32).reshape(1, 64)
    frames = [bytes(f) for f in encode_request(7, model="mlp-light", klass="realtime", deadline_ms=20, inputs={"x": x})]
    request = agrees(frames)
    assert request is not None
    assert request.inputs == [TensorSpec("x", "float32", (1, 64))] and request.deadline_ms == 20.0


def test_a_broken_request_is_refused_with_the_checked_paths_message() -> None:
    """The fast path writes no error of its own: the checked path's message reaches the client."""
    frames = [msgpack.packb({**VALID_INFER, "deadline_ms": -1}), b"\0" * 256]
    assert fast.decode_request(frames, LIMITS) is None
    try:
        decode_request(frames, LIMITS)
    except ProtocolError as exc:
        assert exc.status is Status.INVALID_ARGUMENT and "'deadline_ms' must be a finite number > 0" in exc.message
    else:
        raise AssertionError("a negative deadline was accepted")


# --- Signature: the quick check and the checked bind --------------------------

SIGNATURES = [
    Signature((TensorSpec("x", "float32", (-1, 64)),), (TensorSpec("scores", "float32", (-1, 10)),)),
    Signature(
        (TensorSpec("input", "float32", (-1, -1)), TensorSpec("state", "float32", (2, -1, 4))),
        (TensorSpec("output", "float32", (-1, 1)),),
    ),
    Signature(
        (TensorSpec("x", "float32", (-1, 4)), TensorSpec("state", "float32", (-1, 2))),
        (TensorSpec("scores", "float32", (-1, 1)),),
    ),
]
spec_names = st.sampled_from(["x", "input", "state", "other"])


@st.composite
def near_requests(draw: st.DrawFn, signature: Signature) -> list[TensorSpec]:
    """The declared inputs made concrete, then sometimes bent: a name, a dtype, a size
    (fixed or not), a dimension too many or too few, inputs dropped or reordered."""
    batch = draw(st.integers(1, 4))
    specs = [
        TensorSpec(
            s.name, s.dtype, tuple(batch if i == 0 and signature.batchable else d for i, d in enumerate(s.shape))
        )
        for s in signature.inputs
    ]
    specs = [
        TensorSpec(s.name, s.dtype, tuple(d if d != -1 else draw(st.integers(1, 5)) for d in s.shape)) for s in specs
    ]
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, len(specs) - 1))
        name, dtype, shape = specs[i].name, specs[i].dtype, list(specs[i].shape)
        bend = draw(st.sampled_from(["name", "dtype", "size", "batch", "rank", "drop", "swap"]))
        if bend == "name":
            name = draw(spec_names)
        elif bend == "dtype":
            dtype = "int64"
        elif bend == "size" and shape:
            shape[draw(st.integers(0, len(shape) - 1))] = draw(st.integers(1, 70))
        elif bend == "batch" and shape:
            shape[0] += 1
        elif bend == "rank":
            shape = shape[:-1] if shape and draw(st.booleans()) else [*shape, 1]
        specs[i] = TensorSpec(name, dtype, tuple(shape))
        if bend == "drop" and len(specs) > 1:
            specs.pop(i)
        elif bend == "swap":
            specs.reverse()
    return specs


@given(data=st.data(), signature=st.sampled_from(SIGNATURES))
@settings(max_examples=500)
def test_the_quick_signature_check_passes_only_what_the_checked_bind_accepts(
    data: st.DataObject, signature: Signature
) -> None:
    specs = data.draw(near_requests(signature))
    outputs = data.draw(st.none() | st.lists(st.sampled_from(["scores", "output", "nope"]), max_size=2))
    payloads = [np.zeros(spec.shape, np.float32 if spec.dtype == "float32" else np.int64).tobytes() for spec in specs]
    request = Request(id=1, op="infer", model="m", inputs=specs, payloads=payloads, outputs=outputs)
    if not signature._expected(request):
        return
    signature._checked(request)  # raises ProtocolError if the quick check let a bad request by
    assert list(signature.bind(request)) == [spec.name for spec in specs]


def test_the_declared_request_passes_the_quick_check() -> None:
    signature = SIGNATURES[1]
    specs = [TensorSpec("input", "float32", (3, 512)), TensorSpec("state", "float32", (2, 3, 4))]
    request = Request(id=1, op="infer", model="m", inputs=specs, payloads=[b"\0" * 6144, b"\0" * 96])
    assert signature._expected(request)
    assert not signature._expected(Request(id=1, op="infer", model="m", inputs=specs[::-1], payloads=[]))


# --- the OK reply --------------------------------------------------------------


@given(request_id=st.integers(0, 2**64 - 1) | st.text(max_size=10), outputs=st.dictionaries(spec_names, tensors()))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_the_fast_ok_reply_reads_as_the_checked_one(request_id: Any, outputs: dict[str, np.ndarray]) -> None:
    frames = fast.encode_ok(request_id, 1, 2, 3, outputs)
    if frames is None:
        return
    timing = {"queue": 1, "compute": 2, "total": 3}
    expected = decode_reply([bytes(f) for f in encode_reply(request_id, Status.OK, outputs=outputs, timing_us=timing)])
    got = decode_reply([bytes(f) for f in frames])
    assert got.header == expected.header
    for name, array in expected.outputs.items():
        assert got.outputs[name].tobytes() == array.tobytes()


def test_a_float32_reply_takes_the_fast_path_and_float64_does_not() -> None:
    assert fast.encode_ok(1, 0, 0, 0, {"y": np.zeros((1, 10), np.float32)}) is not None
    assert fast.encode_ok(1, 0, 0, 0, {"y": np.zeros((1, 10), np.float64)}) is None


# --- the OVERLOADED reply ------------------------------------------------------


@given(
    request_id=st.none() | st.integers(0, 2**64 - 1) | st.text(max_size=10) | st.binary(max_size=16),
    message=st.text(max_size=200),
    retry_after_ms=st.floats(0.1, 1e6),
    total_us=st.integers(0, 2**40),
)
@settings(max_examples=300)
def test_the_fast_overloaded_reply_is_the_checked_ones_bytes(
    request_id: Any, message: str, retry_after_ms: float, total_us: int
) -> None:
    timing = {"queue": 0, "compute": 0, "total": total_us}
    expected = encode_reply(
        request_id, Status.OVERLOADED, error=message, retry_after_ms=retry_after_ms, timing_us=timing
    )
    assert fast.encode_overloaded(request_id, message, retry_after_ms, total_us) == expected
