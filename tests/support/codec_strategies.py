"""Hypothesis strategies for the wire codec: any id, tensor or msgpack value, and valid
infer headers mutated a few keys at a time."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np
from hypothesis import strategies as st

from edged.wire.codec import DTYPES, MAX_ID_BYTES, Limits

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
