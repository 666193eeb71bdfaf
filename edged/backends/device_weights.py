"""One copy of an ONNX model's weights on the GPU per process, shared by every ONNX Runtime
CUDA session of that model (edged.backends.onnxruntime_cuda).

The initializers are read from the model file with onnx (external data included),
copied once into one device allocation that edged owns, and handed to ONNX Runtime as
OrtValues over it (edged.backends.dlpack), which each lane's session takes with
`SessionOptions.add_initializer`. ONNX Runtime uses a user's initializer in place when
its device is the one the session planned for that initializer (SaveInitializedTensors
in onnxruntime/core/framework/session_state_utils.cc: `use_user_supplied_initializer`
compares the OrtValue's device with the plan's, and a match is not copied); otherwise it
logs "Cannot use user supplied initializer" and makes its own copy. Small initializers
(under SHARED_MIN_BYTES: shapes, scales) stay in each session: ONNX Runtime keeps many
on the host, and they cost nothing.

The copy lives in DEVICE_WEIGHTS while any runner holds it; a runner gives it back when
it closes, after its session is freed, since the session points into it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from edged.backends import cuda, dlpack
from edged.backends.shared import Key, Shared, file_key
from edged.models.repository import ModelEntry

SHARED_MIN_BYTES = 1024
ALIGN = 256  # each tensor's offset in the allocation, as cudaMalloc aligns its own


@dataclass(eq=False)
class DeviceWeights:
    """A model's shared initializers: one device allocation and an OrtValue per tensor in it."""

    buffer: Any  # cuda.DeviceBuffer
    values: dict[str, Any]  # initializer name -> OrtValue over `buffer`
    views: list[dlpack.View] = field(default_factory=list)  # what the values point at

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)

    def close(self) -> None:
        """Free in the reverse order of use: the values (which call their views' deleter), the views, the memory."""
        self.values.clear()
        self.views.clear()
        self.buffer.close()


def _free(weights: DeviceWeights) -> None:
    weights.close()


DEVICE_WEIGHTS: Shared[DeviceWeights] = Shared(free=_free)  # the process's: a reload finds the old copies


def weights_key(model: ModelEntry, device: int) -> Key:
    return file_key(model.variant.path, "cuda", device)


def shareable(path: Path) -> dict[str, np.ndarray]:
    """The model's initializers worth one shared device copy, by name."""
    found = {}
    for tensor in onnx.load(str(path)).graph.initializer:
        array = np.ascontiguousarray(numpy_helper.to_array(tensor))
        if array.nbytes >= SHARED_MIN_BYTES and dlpack.dtype_supported(array.dtype):
            found[tensor.name] = array
    return found


def layout(arrays: dict[str, np.ndarray]) -> tuple[dict[str, int], int]:
    """Each array's offset in one allocation, aligned, and the allocation's size."""
    offsets, end = {}, 0
    for name, array in arrays.items():
        offsets[name] = end
        end += -(-array.nbytes // ALIGN) * ALIGN
    return offsets, end


def load_device_weights(ort: Any, path: Path, device: int) -> DeviceWeights:
    """The model's shareable initializers, copied to `device` once, as OrtValues."""
    arrays = shareable(path)
    offsets, total = layout(arrays)
    weights = DeviceWeights(cuda.DeviceBuffer(total), {})
    try:
        cuda.upload_at_load(weights.buffer.pointer, [(offsets[name], array) for name, array in arrays.items()])
        for name, array in arrays.items():
            pointer = weights.buffer.pointer + offsets[name]
            weights.views.append(dlpack.view(pointer, array.shape, array.dtype, dlpack.CUDA, device))
            weights.values[name] = dlpack.ort_value(ort, weights.views[-1])
    except BaseException:
        weights.close()
        raise
    return weights
