"""A large model for memory figures: three float32 MatMuls of side x side, written as an
ONNX file (bench/weights_sharing.py, tests/backends/test_shared_weights.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# onnx 1.23 writes IR version 14 unless told, which onnxruntime 1.31 refuses to load (seen
# on the first GPU machine): the models written here say 8, which every recent runtime reads.
IR_VERSION = 8


def portable_model(graph: onnx.GraphProto) -> onnx.ModelProto:
    """`graph` as a model at opset 17 and IR version 8, whatever onnx wrote it."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = IR_VERSION
    return model


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
    onnx.save(portable_model(graph), path)
