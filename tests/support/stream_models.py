"""Small ONNX files shaped like the real models that broke warm-up, built with onnx.helper.

- `padder`: y = Pad(x, reflect, 2 each side of the last axis). A reflect Pad needs
  more samples than it pads (as Silero VAD's), so 1 sample, the old warm-up, fails.
- `streamer`: Silero VAD's interface in small. `input` [batch, samples] (reflect-padded
  too), `state` [2, batch, 4] (batch in dimension 1), `sr` a 0-d int64; it returns
  `stateN` = state + the sum of each row of the padded input, and `output` [batch, 1] =
  the sum of stateN over its other axes times sr / 1000. Its result depends on the
  state carried from call to call, as a streaming model's does.
- `tiny_image`: y = x + a constant [1, 3, 2, 2], x [batch, 3, height, width]: it takes
  images of 1 or 2 pixels a side only, as a model that cannot serve a real size.
- `reshaper`: y = Reshape(x, [-1, k]) (zeros kept as zeros), x [batch, samples], k a 0-d
  int64: at k = 0, edged's fill, it refuses every size; at 16, any multiple of 16.
- `detector`: a 3x3 convolution, x [batch, 3, height, width], its metadata's `imgsz`
  "[320, 320]" as an exported detector's: it takes any size of 3 pixels a side or more.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


def _pads() -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(np.array([0, 2, 0, 2], dtype=np.int64), "pads")]


def padder(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")],
        "padder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "samples"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "padded"])],
        _pads(),
    )
    return _save(graph, path)


def streamer(path: Path) -> Path:
    nodes = [
        helper.make_node("Pad", ["input", "pads"], ["padded"], mode="reflect"),
        helper.make_node("ReduceSum", ["padded", "one"], ["sums"], keepdims=1),  # [batch, 1]
        helper.make_node("Add", ["state", "sums"], ["stateN"]),  # [2, batch, 4]
        helper.make_node("ReduceSum", ["stateN", "zero_two"], ["total"], keepdims=0),  # [batch]
        helper.make_node("Cast", ["sr"], ["rate"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["rate", "thousand"], ["scale"]),
        helper.make_node("Mul", ["total", "scale"], ["scaled"]),
        helper.make_node("Unsqueeze", ["scaled", "one"], ["output"]),  # [batch, 1]
    ]
    weights = [
        *_pads(),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
        numpy_helper.from_array(np.array([0, 2], dtype=np.int64), "zero_two"),
        numpy_helper.from_array(np.array(1000.0, dtype=np.float32), "thousand"),
    ]
    graph = helper.make_graph(
        nodes,
        "streamer",
        [
            helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "samples"]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 4]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1]),
            helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, "batch", 4]),
        ],
        weights,
    )
    return _save(graph, path)


def run_in_process(path: Path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, inputs)


def tiny_image(path: Path) -> Path:
    offset = numpy_helper.from_array(np.ones((1, 3, 2, 2), dtype=np.float32), "offset")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "offset"], ["y"])],
        "tiny_image",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [offset],
    )
    return _save(graph, path)


def reshaper(path: Path) -> Path:
    nodes = [
        helper.make_node("Unsqueeze", ["k", "zero"], ["k1"]),
        helper.make_node("Concat", ["minus_one", "k1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=1),
    ]
    weights = [
        numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus_one"),
    ]
    graph = helper.make_graph(
        nodes,
        "reshaper",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "samples"]),
            helper.make_tensor_value_info("k", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", "k"])],
        weights,
    )
    return _save(graph, path)


def detector(path: Path) -> Path:
    kernel = numpy_helper.from_array(np.full((4, 3, 3, 3), 0.1, dtype=np.float32), "kernel")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "kernel"], ["y"])],
        "detector",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, "h", "w"])],
        [kernel],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {"imgsz": "[320, 320]", "task": "detect"})
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


def set_warmup(manifest: Path, warmup: list[dict]) -> None:
    raw = json.loads(manifest.read_text())
    raw["warmup"] = warmup
    manifest.write_text(json.dumps(raw))
