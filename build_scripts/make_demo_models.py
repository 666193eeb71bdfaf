"""Build the two demo models of the embedded model repository, deterministically.

    python build_scripts/make_demo_models.py [--out engines] [--model NAME] [--seed N]

Weights come from a seeded generator and the graphs are written with onnx.helper,
so the same command gives byte-identical files on any machine: no download, no torch.

- `mlp-light`: a 3-layer MLP, x[N, 64] -> scores[N, 10]; batch-1 CPU compute well
  under a millisecond (a fraud score, a ranking feature).
- `cnn-heavy`: a small convolutional classifier, image[N, 3, 64, 64] -> logits[N, 10];
  batch-1 CPU compute of a few milliseconds (a camera frame).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # readable by every onnxruntime and TensorRT release of the last years


def _weight(rng: np.random.Generator, name: str, shape: tuple[int, ...], fan_in: int) -> onnx.TensorProto:
    values = rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
    return numpy_helper.from_array(values.astype(np.float32), name)


def _bias(rng: np.random.Generator, name: str, size: int) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(size) * 0.01).astype(np.float32), name)


def mlp_light(seed: int = 1) -> onnx.ModelProto:
    """x[N, 64] float32 -> scores[N, 10] float32."""
    rng = np.random.default_rng(seed)
    widths = [64, 256, 256, 10]
    nodes, inits = [], []
    current = "x"
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        inits += [_weight(rng, f"w{i}", (fan_in, fan_out), fan_in), _bias(rng, f"b{i}", fan_out)]
        last = i == len(widths) - 2
        gemm_out = "scores" if last else f"h{i}"
        nodes.append(helper.make_node("Gemm", [current, f"w{i}", f"b{i}"], [gemm_out], name=f"fc{i}"))
        if not last:
            nodes.append(helper.make_node("Relu", [gemm_out], [f"a{i}"], name=f"relu{i}"))
            current = f"a{i}"
    graph = helper.make_graph(
        nodes,
        "mlp-light",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    return _model(graph)


def cnn_heavy(seed: int = 2) -> onnx.ModelProto:
    """image[N, 3, 64, 64] float32 -> logits[N, 10] float32."""
    rng = np.random.default_rng(seed)
    convs = [(3, 32, 1), (32, 64, 2), (64, 64, 1), (64, 128, 2), (128, 128, 1)]
    nodes, inits = [], []
    current = "image"
    for i, (cin, cout, stride) in enumerate(convs):
        inits += [_weight(rng, f"k{i}", (cout, cin, 3, 3), cin * 9), _bias(rng, f"c{i}", cout)]
        nodes.append(
            helper.make_node(
                "Conv",
                [current, f"k{i}", f"c{i}"],
                [f"conv{i}"],
                name=f"conv{i}",
                pads=[1, 1, 1, 1],
                strides=[stride, stride],
            )
        )
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"act{i}"], name=f"relu{i}"))
        current = f"act{i}"
    nodes.append(helper.make_node("GlobalAveragePool", [current], ["pooled"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten", axis=1))
    inits += [_weight(rng, "fc_w", (128, 10), 128), _bias(rng, "fc_b", 10)]
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc"))
    graph = helper.make_graph(
        nodes,
        "cnn-heavy",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 64, 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    return _model(graph)


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="edged build_scripts/make_demo_models.py",
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


DEMO_MODELS = {
    "mlp-light": (mlp_light, "3-layer MLP, batch-1 CPU compute well under 1 ms"),
    "cnn-heavy": (cnn_heavy, "5-conv image classifier, batch-1 CPU compute of a few ms"),
}


def _tensor_specs(values: list[onnx.ValueInfoProto]) -> list[dict]:
    specs = []
    for value in values:
        tensor = value.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        shape = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
        specs.append({"name": value.name, "dtype": dtype, "shape": shape})
    return specs


def write_model(name: str, out: Path, seed: int | None = None) -> Path:
    """Write engines/<name>/model.onnx and its manifest.json; returns the folder.

    `seed` gives other weights for the same signature (the model's own seed if None).
    """
    build, description = DEMO_MODELS[name]
    model = build() if seed is None else build(seed=seed)
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    data = model.SerializeToString(deterministic=True)
    (folder / "model.onnx").write_bytes(data)
    manifest = {
        "name": name,
        "description": description,
        "inputs": _tensor_specs(list(model.graph.input)),
        "outputs": _tensor_specs(list(model.graph.output)),
        "variants": [
            {
                "precision": "fp32",
                "backend": "onnxruntime",
                "file": "model.onnx",
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        ],
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "engines")
    parser.add_argument("--model", choices=sorted(DEMO_MODELS), action="append", help="only this model (repeatable)")
    parser.add_argument("--seed", type=int, help="seed of the weights (default: each model's own)")
    args = parser.parse_args(argv)
    for name in args.model or DEMO_MODELS:
        folder = write_model(name, args.out, args.seed)
        print(f"wrote {folder}")


if __name__ == "__main__":
    main()
