"""GPU benchmark of the ONNX Runtime CUDA backend, in one call on a GPU machine.

    python bench/gpu_bench.py [--duration 10] [--realtime-rate 500] [--bulk-rate 4000]

Runs, each against a fresh daemon on server.backend = "onnxruntime-cuda":
1. realtime alone (its lane on a stream of priority -1);
2. realtime under a saturating bulk load, each class on its own priority stream;
3. the same with every lane at stream priority 0 (the ablation: ordinary streams);
and the floor: the realtime model in this process, on the same backend runner at
batch 1 with no daemon in between. Prints a table, writes docs/benchmarks-gpu.json
and the results section of docs/benchmarks-gpu.md, with the device's name.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends.cuda import cuda_available, device_info
from edged.bench import Stream, run_load
from edged.config.classes import ClassConfig
from edged.launch import DaemonProcess
from edged.models.repository import discover

ROOT = Path(__file__).resolve().parent.parent

RESULTS_MARK = "<!-- results: written by bench/gpu_bench.py -->"


def config_text(realtime_priority: int, bulk_priority: int) -> str:
    return f"""
[server]
backend = "onnxruntime-cuda"
default_class = "realtime"
model_repository = "{ROOT / "engines"}"

[classes.realtime]
stream_priority = {realtime_priority}
max_batch = 4
inline_max_us = 0
reserved_memory_mb = 512

[classes.bulk]
stream_priority = {bulk_priority}
max_batch = 16
batch_wait_us = 500
queue_capacity = 512
reserved_memory_mb = 1024
"""


def scenario(name: str, text: str, streams: list[Stream], inputs: dict[str, Any], duration_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="edged-gpu-") as folder:
        config = Path(folder) / "edged.toml"
        config.write_text(text)
        endpoint = f"ipc://{folder}/d.sock"
        with DaemonProcess([endpoint], config=config, log_path=Path(folder) / "daemon.log") as daemon:
            daemon.wait_serving(timeout_s=300)
            rows = run_load(endpoint, streams, inputs, duration_s)
    return {"scenario": name, "classes": rows}


def floor(model_name: str, runs: int) -> dict[str, float]:
    """The realtime model through the same runner, in this process, one request at a time."""
    from edged.backends.onnxruntime_cuda import OnnxRuntimeCuda

    model = next(m for m in discover(ROOT / "engines", "onnxruntime") if m.name == model_name)
    klass = ClassConfig("realtime", order=0, stream_priority=-1, reserved_memory_mb=512)
    backend = OnnxRuntimeCuda()
    backend.reserve([model], [klass])
    runner = backend.load(model, klass)
    inputs = {
        s.name: np.random.default_rng(0).standard_normal([1 if d == -1 else d for d in s.shape]).astype(s.dtype)
        for s in model.signature.inputs
    }
    try:
        for _ in range(200):
            runner.run(inputs, model.signature.output_names)
        times = []
        for _ in range(runs):
            start = time.perf_counter_ns()
            runner.run(inputs, model.signature.output_names)
            times.append((time.perf_counter_ns() - start) / 1000)
    finally:
        runner.close()
    return {k: float(np.percentile(times, q)) for k, q in (("p50", 50), ("p99", 99), ("p999", 99.9))}


def table(device: str, results: list[dict[str, Any]], floor_us: dict[str, float]) -> str:
    lines = [
        f"device: {device}",
        "| scenario | class | offered/s | ok | shed | good/s | p50 ms | p99 ms | p99.9 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for row in result["classes"]:
            lat = row["latency_us"]
            lines.append(
                f"| {result['scenario']} | {row['class']} | {row['offered_rps']:.0f} | {row['ok']} | "
                f"{row['overloaded']} | {row['goodput_rps']:.1f} | "
                + " | ".join(f"{lat[k] / 1000:.3f}" for k in ("p50", "p99", "p999"))
                + " |"
            )
    lines.append(
        "| floor (in-process runner) | realtime | - | - | - | - | "
        + " | ".join(f"{floor_us[k] / 1000:.3f}" for k in ("p50", "p99", "p999"))
        + " |"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per scenario")
    parser.add_argument("--realtime-model", default="mlp-light")
    parser.add_argument("--bulk-model", default="cnn-heavy")
    parser.add_argument("--realtime-rate", type=float, default=500.0)
    parser.add_argument("--bulk-rate", type=float, default=4000.0, help="requests/s of 16 rows: meant to saturate")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    reason = cuda_available()
    if reason is not None:
        raise SystemExit(f"gpu_bench.py needs a CUDA GPU, and this machine has none usable: {reason}")
    device = device_info(0).name
    models = {m.name: [s.to_wire() for s in m.signature.inputs] for m in discover(ROOT / "engines", "onnxruntime")}
    realtime = Stream("realtime", args.realtime_model, args.realtime_rate, 20.0)
    bulk = Stream("bulk", args.bulk_model, args.bulk_rate, 5000.0, rows=16)
    results = [
        scenario("realtime alone", config_text(-1, 0), [realtime], models, args.duration),
        scenario("with bulk, priority streams", config_text(-1, 0), [realtime, bulk], models, args.duration),
        scenario("with bulk, all priority 0", config_text(0, 0), [realtime, bulk], models, args.duration),
    ]
    floor_us = floor(args.realtime_model, runs=5000)
    text = table(device, results, floor_us)
    print(text)
    record = {"device": device, "duration_s": args.duration, "scenarios": results, "floor_us": floor_us}
    (args.out / "benchmarks-gpu.json").write_text(json.dumps(record, indent=2) + "\n")
    doc = args.out / "benchmarks-gpu.md"
    method = doc.read_text().split(RESULTS_MARK)[0]
    stamp = time.strftime("%Y-%m-%d")
    doc.write_text(f"{method}{RESULTS_MARK}\n\n## Results ({stamp}, {args.duration:.0f} s per scenario)\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
