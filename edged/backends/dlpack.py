"""Memory edged owns, offered to ONNX Runtime as an OrtValue that does not own it, through
the DLPack protocol (https://dmlc.github.io/dlpack/latest/): no copy is made.

ONNX Runtime's `SessionOptions.add_initializer` refuses an OrtValue that owns its buffer
("Buffer containing the initializer must be owned by the user": seen here with
onnxruntime 1.32's CPU build, and in its session_options.cc), and
`OrtValue.ortvalue_from_numpy(array, "cuda", 0)` allocates, owns and fills a device copy
of its own. An OrtValue made by `OrtValue.from_dlpack` wraps the producer's pointer
without owning it (onnxruntime/core/dlpack/dlpack_converter.cc, DlpackToOrtValue), and
calls the producer's deleter when it dies. DLPack is in ONNX Runtime's default builds
since PR #23110 (early 2025); before, only in its training builds.

The structures follow dlpack.h's unversioned ABI (the "dltensor" capsule), which is
what ONNX Runtime reads.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

CPU, CUDA = 1, 2  # DLDeviceType: kDLCPU, kDLCUDA
_CODES = {"i": 0, "u": 1, "f": 2}  # DLDataTypeCode: kDLInt, kDLUInt, kDLFloat
_NAME = b"dltensor"  # the capsule's name before a consumer takes it


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),  # NULL: compact, row-major
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]
# The consumer calls it when its value dies; the memory is freed by its owner, after that.
_LEAVE = _Deleter(lambda managed: None)

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def dtype_supported(dtype: np.dtype[Any]) -> bool:
    """Whether ONNX Runtime takes this element type through DLPack (integers and floats:
    its bool, bfloat16 and float8 types are left out here)."""
    return dtype.kind in _CODES and (dtype.kind != "f" or dtype.itemsize in (2, 4, 8))


@dataclass(eq=False)
class View:
    """A tensor at `pointer` that its owner keeps alive, and frees only once every value
    made from this view has died."""

    managed: _Managed
    shape: ctypes.Array[ctypes.c_int64]
    device: tuple[int, int]

    def __dlpack__(self, stream: object = None) -> object:
        return _capsule_new(ctypes.addressof(self.managed), _NAME, None)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


def view(pointer: int, shape: tuple[int, ...], dtype: np.dtype[Any], device_type: int, device_id: int) -> View:
    """A DLPack view of `shape` elements of `dtype` at `pointer` (device memory, or host memory with CPU)."""
    if not dtype_supported(dtype):
        raise ValueError(f"{dtype} cannot be handed to ONNX Runtime through DLPack")
    dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    tensor = _Tensor(
        ctypes.c_void_p(pointer),
        _Device(device_type, device_id),
        len(shape),
        _DataType(_CODES[dtype.kind], dtype.itemsize * 8, 1),
        dims,
        None,
        0,
    )
    return View(_Managed(tensor, None, _LEAVE), dims, (device_type, device_id))


def ort_value(ort: Any, source: View) -> Any:
    """An onnxruntime OrtValue over `source`'s memory, not owning it."""
    make = getattr(ort.OrtValue, "from_dlpack", None)
    if make is not None:
        return make(source)
    # Releases before the Python wrapper had it (PR #27980): the binding's, which names bool apart.
    return ort.OrtValue(ort.capi._pybind_state.OrtValue.from_dlpack(source.__dlpack__(), False))
