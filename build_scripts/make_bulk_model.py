"""Build `bulk-heavy`, the GPU benchmark's bulk model: enough work per byte of input to keep
an H100 busy from a few sender processes, in a small file, deterministically.

    python build_scripts/make_bulk_model.py --out DIR [--channels 256] [--depth 8]

image[N, 3, 64, 64] float32 -> logits[N, 10] float32: a 3x3 stem convolution to
`channels`, then `depth` 3x3 convolutions of `channels` to `channels` at 64 x 64, each
with a ReLU, sharing ONE weight tensor (so the file stays ~2.4 MB at 256 channels while
the work is that of `depth` distinct layers), a global average pool and a linear layer.
At 256 channels and depth 8 that is ~39 GFLOP per image, ~620 GFLOP per 16-row call
(cnn-heavy: ~0.23 GFLOP an image): a 16-row call took 6.3 ms on an H200 (two in flight),
fed by 786 KB of input, so four senders of a few hundred requests a second kept the
device 100% busy (NVML) without the socket being the limit. bench/gpu_bench.py builds it
at the start of a run, beside a copy of mlp-light, in a model repository of its own (it
is not in engines/: every CPU test loads every model there). `--channels 16 --depth 2` gives a small one for the CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
from make_demo_models import _bias, _model, _tensor_specs, _weight
from onnx import TensorProto, helper

NAME = "bulk-heavy"


def bulk_heavy(channels: int = 256, depth: int = 8, seed: int = 3) -> onnx.ModelProto:
    """image[N, 3, 64, 64] float32 -> logits[N, 10] float32 (see the module's docstring)."""
    rng = np.random.default_rng(seed)
    inits = [_weight(rng, "stem_k", (channels, 3, 3, 3), 27), _bias(rng, "stem_b", channels)]
    # He's scale keeps a ReLU layer's output variance; repeated, one matrix must not grow it.
    inits += [_weight(rng, "k", (channels, channels, 3, 3), channels * 9 * 2), _bias(rng, "b", channels)]
    pads = {"pads": [1, 1, 1, 1]}
    nodes = [helper.make_node("Conv", ["image", "stem_k", "stem_b"], ["conv_s"], name="stem", **pads)]
    nodes.append(helper.make_node("Relu", ["conv_s"], ["act_s"], name="relu_s"))
    current = "act_s"
    for i in range(depth):
        nodes.append(helper.make_node("Conv", [current, "k", "b"], [f"conv{i}"], name=f"conv{i}", **pads))
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"act{i}"], name=f"relu{i}"))
        current = f"act{i}"
    nodes.append(helper.make_node("GlobalAveragePool", [current], ["pooled"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten", axis=1))
    inits += [_weight(rng, "fc_w", (channels, 10), channels), _bias(rng, "fc_b", 10)]
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc"))
    graph = helper.make_graph(
        nodes,
        NAME,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 64, 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    return _model(graph)


def gflop_per_image(channels: int, depth: int) -> float:
    """Multiply-adds times two, of the convolutions (the pool and the linear layer are noise)."""
    pixels = 64 * 64
    return 2 * pixels * 9 * (3 * channels + depth * channels * channels) / 1e9


def write_bulk_model(out: Path, channels: int = 256, depth: int = 8) -> Path:
    """Write OUT/bulk-heavy/model.onnx and its manifest.json; returns the folder."""
    model = bulk_heavy(channels, depth)
    folder = out / NAME
    folder.mkdir(parents=True, exist_ok=True)
    data = model.SerializeToString(deterministic=True)
    (folder / "model.onnx").write_bytes(data)
    gflop, digest = gflop_per_image(channels, depth), hashlib.sha256(data).hexdigest()
    manifest = {
        "name": NAME,
        "description": f"{depth} shared-weight 3x3 convolutions of {channels} channels: {gflop:.1f} GFLOP an image",
        "inputs": _tensor_specs(list(model.graph.input)),
        "outputs": _tensor_specs(list(model.graph.output)),
        "variants": [{"precision": "fp32", "backend": "onnxruntime", "file": "model.onnx", "sha256": digest}],
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the model repository to write it into")
    parser.add_argument("--channels", type=int, default=256)
    parser.add_argument("--depth", type=int, default=8)
    args = parser.parse_args(argv)
    folder = write_bulk_model(args.out, args.channels, args.depth)
    print(f"wrote {folder} ({gflop_per_image(args.channels, args.depth):.1f} GFLOP an image)")


if __name__ == "__main__":
    main()
