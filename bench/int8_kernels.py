"""INT8 on this CPU: FP32, the INT8 Q/DQ graph fused (ONNX Runtime's integer kernels)
and unfused (its own math, as TensorRT computes it), by accuracy and latency.

    python bench/int8_kernels.py [--calls N] [--json FILE]
    qemu-x86_64 -cpu EPYC-Milan .venv/bin/python bench/int8_kernels.py --calls 1 --rounds 1   # no VNNI

Each demo model is quantized (INT8, the default calibration) into a temporary copy of
engines/; accuracy is against FP32 on 64 held-out samples (8 for cnn-heavy); latency is
one sample (batch 1) and a batch of 8, one thread, calls interleaved across the three
forms in rounds so that a busy moment of the box falls on all of them. Under qemu the
accuracy is the emulated CPU's and the timings mean nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from edged.backends.onnxruntime_cpu import cpu_session
from edged.models.accuracy import compare
from edged.models.manifest import ModelFolder
from edged.toolchain.calibration import held_out
from edged.toolchain.quantize import quantize

ENGINES = Path(__file__).resolve().parents[1] / "engines"
MODELS = {"mlp-light": (256, 64), "cnn-heavy": (16, 8)}  # calibration and held-out samples, as the tests


def measure(root: Path, model: str, calls: int, rounds: int) -> dict[str, dict[str, float]]:
    calibration, held = MODELS[model]
    folder = ModelFolder(root, model)
    int8 = quantize(folder, "int8", calibration_count=calibration, held_out_count=held).path
    forms = {
        "fp32": cpu_session(folder.source(), "fp32"),
        "int8 fused": cpu_session(int8, "int8"),
        "int8 unfused": cpu_session(int8, "int8", fused=False),
    }
    samples = held_out(folder.inputs, held)
    reference = forms["fp32"].run(None, samples)[0]
    figures: dict[str, dict[str, float]] = {}
    for name, session in forms.items():
        accuracy = compare(reference, session.run(None, samples)[0])
        figures[name] = {"cosine_min": accuracy.cosine_min, "max_abs_error": accuracy.max_abs_error}
    for rows in (1, 8):
        batch = {key: np.resize(array, (rows, *array.shape[1:])) for key, array in samples.items()}
        times: dict[str, list[int]] = {name: [] for name in forms}
        for _ in range(rounds):
            for name, session in forms.items():
                session.run(None, batch)
                for _ in range(calls):
                    started = time.perf_counter_ns()
                    session.run(None, batch)
                    times[name].append(time.perf_counter_ns() - started)
        for name, samples_ns in times.items():
            figures[name][f"p50_us_batch{rows}"] = float(np.percentile(samples_ns, 50)) / 1e3
            figures[name][f"p99_us_batch{rows}"] = float(np.percentile(samples_ns, 99)) / 1e3
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=50, help="timed calls per form and round")
    parser.add_argument("--rounds", type=int, default=10, help="rounds, each form in turn")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "engines"
        for model in MODELS:
            shutil.copytree(ENGINES / model, root / model)
        results = {model: measure(root, model, args.calls, args.rounds) for model in MODELS}
    print(f"{'model':<10} {'form':<13} {'cos min':>8} {'max abs':>8} {'p50 b1 us':>10} {'p50 b8 us':>10}")
    for model, forms in results.items():
        for name, f in forms.items():
            print(
                f"{model:<10} {name:<13} {f['cosine_min']:>8.5f} {f['max_abs_error']:>8.4f} "
                f"{f['p50_us_batch1']:>10.1f} {f['p50_us_batch8']:>10.1f}"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
