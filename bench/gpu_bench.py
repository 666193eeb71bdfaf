"""GPU benchmark of the ONNX Runtime CUDA backend, in one call on a GPU machine.

    python bench/gpu_bench.py [--duration 10] [--repeats 3] [--out DIR] [--docs]

NOT YET RUN: written on machines with no GPU (see bench/gpu_verify.sh). Scenarios,
each against a fresh daemon, run in turn and repeated `--repeats` times, interleaved
(A B C D, A B C D, ...), so a drift of the machine falls on every scenario alike:
1. realtime alone (its lane on a stream of priority -1);
2. realtime beside a saturating bulk load, each class on its own priority stream;
3. the same with each lane on its own stream, all at priority 0;
4. the same with every lane on ONE shared stream (bench/one_stream.py): the ablation;
5. priority streams, with bulk's lane in a green context of BULK_SMS SMs
   (classes.bulk.sm_count, edged.backends.green), realtime on the whole device.
Bulk load comes from a process and a socket of its own, so a saturated bulk generator
never delays realtime's sends. Then the floor: the realtime model in this process, on
the same backend runner at batch 1, no daemon in between. Prints a table last (median
over the repetitions; each class's offered, sent and achieved rates), writes every
repetition to DIR/gpu-bench.json and the table to DIR/gpu-bench.md; with --docs, also
the results section of docs/benchmarks-gpu.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
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
ONE_STREAM = [sys.executable, str(ROOT / "bench" / "one_stream.py")]


def config_text(backend: str, realtime_priority: int, bulk_priority: int, bulk_sms: int = 0) -> str:
    return f"""
[server]
backend = "{backend}"
default_class = "realtime"
model_repository = "{ROOT / "engines"}"

[classes.realtime]
stream_priority = {realtime_priority}
max_batch = 4
inline_max_us = 0
arena_cap_mb = 512

[classes.bulk]
stream_priority = {bulk_priority}
sm_count = {bulk_sms}
max_batch = 16
batch_wait_us = 500
queue_capacity = 512
arena_cap_mb = 1024
"""


# Bulk's SMs in the green-context scenario: of an H100's or H200's 132, a multiple of 8
# (Hopper's partition granularity), leaving realtime 36 that bulk never occupies.
BULK_SMS = 96
# name, backend, realtime and bulk priorities, with bulk, launched through bench/one_stream.py[, bulk's SMs]
SCENARIOS = (
    ("realtime alone", "onnxruntime-cuda", -1, 0, False, False),
    ("with bulk, priority streams", "onnxruntime-cuda", -1, 0, True, False),
    ("with bulk, own streams, all priority 0", "onnxruntime-cuda", 0, 0, True, False),
    ("with bulk, one shared stream", "onnxruntime-cuda-one-stream", 0, 0, True, True),
    (f"with bulk in a green context of {BULK_SMS} SMs", "onnxruntime-cuda", -1, 0, True, False, BULK_SMS),
)


def scenario(
    spec: tuple[Any, ...],
    streams: tuple[Stream, Stream],
    inputs: dict[str, Any],
    duration_s: float,
) -> dict[str, Any]:
    name, backend, realtime_priority, bulk_priority, with_bulk, one_stream, *bulk_sms = spec
    realtime, bulk = streams
    with tempfile.TemporaryDirectory(prefix="edged-gpu-") as folder:
        config = Path(folder) / "edged.toml"
        config.write_text(config_text(backend, realtime_priority, bulk_priority, *bulk_sms))
        endpoint = f"ipc://{folder}/d.sock"
        log = Path(folder) / "daemon.log"
        program = ONE_STREAM if one_stream else None
        with DaemonProcess([endpoint], config=config, log_path=log, program=program) as daemon:
            daemon.wait_serving(timeout_s=300)
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as other:
                # Bulk's generator: its own process and socket. A first empty run imports
                # and connects there, so both loads start within milliseconds of each other.
                other.submit(run_load, endpoint, [], inputs, 0.0).result()
                bulk_rows = other.submit(run_load, endpoint, [bulk], inputs, duration_s, seed=1) if with_bulk else None
                rows = run_load(endpoint, [realtime], inputs, duration_s)
                if bulk_rows is not None:
                    rows += bulk_rows.result(timeout=duration_s + 120)
    for row, stream in zip(rows, streams):
        row["sent_rps"] = row["sent"] / duration_s
        row["ok_rows_per_s"] = row["ok"] * stream.rows / duration_s
    return {"scenario": name, "classes": rows}


def floor(model_name: str, runs: int) -> dict[str, float]:
    """The realtime model through the same runner, in this process, one request at a time."""
    from edged.backends.onnxruntime_cuda import OnnxRuntimeCuda

    model = next(m for m in discover(ROOT / "engines", "onnxruntime") if m.name == model_name)
    klass = ClassConfig("realtime", order=0, stream_priority=-1, arena_cap_mb=512)
    backend = OnnxRuntimeCuda()
    backend.reserve([model], [klass], backend.free_bytes())
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


def medians(repetitions: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per scenario and class, the median over the repetitions of each figure in the table."""
    table = []
    for runs in zip(*repetitions):
        rows = []
        for per_class in zip(*(run["classes"] for run in runs)):
            row = {"class": per_class[0]["class"], "offered_rps": per_class[0]["offered_rps"]}
            for key in ("sent_rps", "ok", "overloaded", "goodput_rps", "ok_rows_per_s"):
                row[key] = statistics.median(r[key] for r in per_class)
            latency = [r["latency_us"] for r in per_class]
            row["latency_us"] = {k: statistics.median(lat[k] for lat in latency) for k in ("p50", "p99", "p999")}
            rows.append(row)
        table.append({"scenario": runs[0]["scenario"], "classes": rows})
    return table


def format_table(device: str, repeats: int, results: list[dict[str, Any]], floor_us: dict[str, float]) -> str:
    lines = [
        f"device: {device}; median of {repeats} interleaved repetitions",
        "| scenario | class | offered/s | sent/s | ok | shed | good/s | ok rows/s | p50 ms | p99 ms | p99.9 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for row in result["classes"]:
            lat = row["latency_us"]
            lines.append(
                f"| {result['scenario']} | {row['class']} | {row['offered_rps']:.0f} | {row['sent_rps']:.0f} | "
                f"{row['ok']:.0f} | {row['overloaded']:.0f} | {row['goodput_rps']:.1f} | {row['ok_rows_per_s']:.0f} | "
                + " | ".join(f"{lat[k] / 1000:.3f}" for k in ("p50", "p99", "p999"))
                + " |"
            )
    lines.append(
        "| floor (in-process runner) | realtime | - | - | - | - | - | - | "
        + " | ".join(f"{floor_us[k] / 1000:.3f}" for k in ("p50", "p99", "p999"))
        + " |"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per scenario and repetition")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--realtime-model", default="mlp-light")
    parser.add_argument("--bulk-model", default="cnn-heavy")
    parser.add_argument("--realtime-rate", type=float, default=500.0)
    parser.add_argument("--bulk-rate", type=float, default=4000.0, help="requests/s of 16 rows: meant to saturate")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for gpu-bench.json and gpu-bench.md")
    parser.add_argument("--docs", action="store_true", help="also rewrite docs/benchmarks-gpu.md's results")
    args = parser.parse_args()
    reason = cuda_available()
    if reason is not None:
        raise SystemExit(f"gpu_bench.py needs a CUDA GPU, and this machine has none usable: {reason}")
    device = device_info(0).name
    inputs = {m.name: [s.to_wire() for s in m.signature.inputs] for m in discover(ROOT / "engines", "onnxruntime")}
    streams = (
        Stream("realtime", args.realtime_model, args.realtime_rate, 20.0),
        Stream("bulk", args.bulk_model, args.bulk_rate, 5000.0, rows=16),
    )
    repetitions = []
    for repetition in range(args.repeats):
        print(f"repetition {repetition + 1} of {args.repeats}", file=sys.stderr)
        repetitions.append([scenario(spec, streams, inputs, args.duration) for spec in SCENARIOS])
    floor_us = floor(args.realtime_model, runs=5000)
    text = format_table(device, args.repeats, medians(repetitions), floor_us)
    record = {"device": device, "duration_s": args.duration, "repetitions": repetitions, "floor_us": floor_us}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu-bench.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / "gpu-bench.md").write_text(text + "\n")
    if args.docs:
        doc = ROOT / "docs" / "benchmarks-gpu.md"
        method = doc.read_text().split(RESULTS_MARK)[0]
        stamp = time.strftime("%Y-%m-%d")
        doc.write_text(f"{method}{RESULTS_MARK}\n\n## Results ({stamp}, {args.duration:.0f} s per run)\n\n{text}\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
