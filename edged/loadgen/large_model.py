"""A large model for memory figures: three float32 MatMuls of side x side, written as an
ONNX file (bench/weights_sharing.py, tests/backends/test_shared_weights.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def write_matmuls(path: Path, side: int, seed: int = 0) -> None:
    """x [batch, side] through three side x side weights (3 * side^2 * 4 bytes) to y."""
    rng = np.random.default_rng(seed)
    weights = [
        numpy_helper.from_array((rng.standard_normal((side, side)) * 0.02).astype(np.float32), f"w{i}")
        for i in range(3)
    ]
    nodes = [helper.make_node("MatMul", [src, f"w{i}"], [dst]) for i, (src, dst) in enumerate(zip("xab", "aby"))]
    graph = helper.make_graph(
        nodes,
        "matmuls",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", side])],
        weights,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
