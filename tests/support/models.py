"""Small models built for the tests beside the demo ones, and a repository to hold them.

- `lookup` returns rows of a 10-row table; an index past the table makes ONNX
  Runtime fail on that request alone, which is how a real backend error looks.
- `sleeper` takes one int64 `n` and runs 16 matmuls over an [n, 512] tensor: its
  cost follows a value, not a shape (as with NMS or a decoding loop), so no
  estimate made from shapes can foresee it, and warm-up (n = 0) makes it look free.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from support import ENGINES, short_dir

TABLE = np.arange(30, dtype=np.float32).reshape(10, 3)
SLEEPER_WIDTH = 512
# The sleeper runs for up to seconds; every lane's watchdog waits 60 s, so it never
# mistakes a slow box for a hung call.
PATIENT_WATCHDOGS = "".join(f"[classes.{name}]\nstuck_after_ms = 60000\n" for name in ("realtime", "standard", "bulk"))


def save_model(root: Path, graph: onnx.GraphProto, inputs: list[dict], outputs: list[dict]) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    folder = root / graph.name
    folder.mkdir(parents=True)
    onnx.save(model, folder / "model.onnx")
    manifest = {
        "name": graph.name,
        "inputs": inputs,
        "outputs": outputs,
        "variants": [{"precision": "fp32", "backend": "onnxruntime", "file": "model.onnx"}],
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))


def lookup_graph() -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Gather", ["table", "index"], ["rows"], axis=0)],
        "lookup",
        [helper.make_tensor_value_info("index", TensorProto.INT64, ["N", 1])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["N", 1, 3])],
        [numpy_helper.from_array(TABLE, "table")],
    )


def sleeper_graph(matmuls: int = 16) -> onnx.GraphProto:
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    nodes = [
        helper.make_node("Concat", ["n", "width"], ["shape"], axis=0),
        helper.make_node("ConstantOfShape", ["shape"], ["h0"], value=one),
    ]
    nodes += [helper.make_node("MatMul", [f"h{i}", "w"], [f"h{i + 1}"]) for i in range(matmuls)]
    nodes.append(helper.make_node("ReduceSum", [f"h{matmuls}"], ["total"], keepdims=1))
    # Each row of w sums to 1, so ones stay ones and the total is exactly n * 512.
    w = np.full((SLEEPER_WIDTH, SLEEPER_WIDTH), 1 / SLEEPER_WIDTH, dtype=np.float32)
    return helper.make_graph(
        nodes,
        "sleeper",
        [helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [1, 1])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([SLEEPER_WIDTH], dtype=np.int64), "width")],
    )


def save_sleeper(root: Path) -> None:
    """The sleeper model, and mlp-light beside it, in a repository at `root`."""
    save_model(
        root,
        sleeper_graph(),
        [{"name": "n", "dtype": "int64", "shape": [1]}],
        [{"name": "total", "dtype": "float32", "shape": [1, 1]}],
    )
    shutil.copytree(ENGINES / "mlp-light", root / "mlp-light")


def sleep_for(n: int) -> dict[str, np.ndarray]:
    return {"n": np.array([n], dtype=np.int64)}


def dear_warmup_repository(n: int) -> Path:
    """A fresh repository of the sleeper and mlp-light, the sleeper warmed up at `n`: each
    warm-up of new lanes on the loop's thread then takes a while (the caller removes it)."""
    root = short_dir()
    save_sleeper(root)
    manifest_path = root / "sleeper" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["warmup"] = [{"data": {"n": n}}]
    manifest_path.write_text(json.dumps(manifest))
    return root
