"""How far ONNX Runtime's CUDA provider may stray from its CPU provider: TF32.

The CUDA provider (use_tf32, on by default) computes convolutions and matrix products
in TF32 on Ampere and newer: each operand keeps 10 of float32's 23 mantissa bits, so
it is off by up to 2**-11 of itself and each product by up to 2**-10. A layer's error
is at most that share of the sum of |products|, which with activations of mixed sign
is of the order of the layer's outputs; we allow 4 times that per layer (cuDNN's
choice of algorithm reorders the sums too), added over the model's layers, relative
to the largest output magnitude: mlp-light (3 layers) 1.2%, cnn-heavy (6) 2.3%.
tests/backends/test_gpu.py checks the bound on the CPU against an emulation of TF32's rounding
and uses it on a GPU; bench/gpu_checks.py uses it for the daemon's replies.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import onnx

from edged.models.repository import ModelEntry

TF32_PER_LAYER = 4 * 2**-10
LAYERS = ("Conv", "Gemm", "MatMul")


@cache
def layer_count(path: Path) -> int:
    """The convolution and matrix-product nodes of the ONNX model at `path`."""
    return sum(node.op_type in LAYERS for node in onnx.load(path).graph.node)


def tf32_atol(model: ModelEntry, expected: np.ndarray) -> float:
    """The absolute error TF32 may bring to `expected`, an output of `model`."""
    return layer_count(model.variant.path) * TF32_PER_LAYER * float(np.abs(expected).max())
