"""How tensors travel: the wire's dtype names, little-endian bytes in C order, one raw
frame per tensor, and arrays that are views of the frames they arrived in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
}
# Wire dtypes are little endian; on a big-endian host every view would need a swap.
LITTLE_ENDIAN = {name: dtype.newbyteorder("<") for name, dtype in DTYPES.items()}
_WIRE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def wire_name(dtype: np.dtype) -> str:
    """The wire's name for `dtype`; raises ValueError for one it has none for."""
    name = _WIRE_NAMES.get(np.dtype(dtype).newbyteorder("="))
    if name is None:
        raise ValueError(f"dtype {dtype} has no wire name; supported: {', '.join(DTYPES)}")
    return name


def view(payload: bytes | memoryview, dtype: str, shape: Sequence[int]) -> np.ndarray:
    """The tensor in `payload` as an array over the same bytes: no copy."""
    return np.frombuffer(payload, dtype=LITTLE_ENDIAN[dtype]).reshape(shape)


def tensor_frames(tensors: dict[str, np.ndarray]) -> tuple[list[dict[str, Any]], list[bytes | memoryview]]:
    """Each tensor's {name, dtype, shape} and its bytes, as a view where its layout allows."""
    specs, payloads = [], []
    for name, array in tensors.items():
        # Not ascontiguousarray: it turns a 0-d tensor into shape [1], and the reply would lie about the shape.
        array = np.asarray(array, order="C")
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        dtype = _WIRE_NAMES.get(array.dtype)
        if dtype is None:
            raise ValueError(f"{name!r}: dtype {array.dtype} has no wire name; supported: {', '.join(DTYPES)}")
        specs.append({"name": name, "dtype": dtype, "shape": list(array.shape)})
        # A uint8 view exports a plain byte buffer for every dtype, ml_dtypes' included.
        payloads.append(array.reshape(-1).view(np.uint8).data)
    return specs, payloads
