"""GPU benchmark of the ONNX Runtime CUDA backend, in one call on a GPU machine.

    python bench/gpu_bench.py [--duration 10] [--repeats 3] [--scenarios 1,2,...] [--out DIR] [--docs]

NOT YET RUN: written on machines with no GPU (see bench/gpu_verify.sh). Scenarios,
each against a fresh daemon, run in turn and repeated `--repeats` times, interleaved
(A B C D, A B C D, ...), so a drift of the machine falls on every scenario alike:
1. realtime alone (its lane on a stream of priority -1);
2. realtime beside a saturating bulk load, each class on its own priority stream, bulk
   yielding and preemptible (its built-in settings);
3. the same with bulk's preemption off (classes.bulk yields = false, preemptible = false);
4. the same as 2 with realtime's CUDA graphs on (classes.realtime.cuda_graph = true);
5. the same as 2 with each lane on its own stream, all at priority 0;
6. the same with every lane on ONE shared stream (bench/one_stream.py): the ablation;
7. priority streams, with bulk's lane in a green context of BULK_SMS SMs
   (classes.bulk.sm_count, edged.backends.green), realtime on the whole device;
8. bulk alone, and 9. bulk alone at twice its rate: "bulk saturates" holds when the
   second achieves at most SATURATED_WITHIN more rows/s than the first (printed last;
   exit code 1 when it does not hold, or the generator could not offer twice the rate).
Bulk load comes from a process and a socket of its own, so a saturated bulk generator
never delays realtime's sends. During each scenario's load, nvidia-smi samples GPU
utilisation every 100 ms (its median per scenario; none without nvidia-smi). Then the
floor: the realtime model in this process, on the same backend runner at batch 1, no
daemon in between. Prints a table last (median over the repetitions; each class's
offered, sent and achieved rates), writes every repetition to DIR/gpu-bench.json and the
table to DIR/gpu-bench.md; with --docs, also the results section of docs/benchmarks-gpu.md.

Time, estimated (nothing here has been timed on a GPU): per scenario and repetition, the
load's --duration plus ~20 s (a fresh daemon: CUDA context, 4 sessions, warm-up of every
batch size with cuDNN's algorithm search, CUDA graph capture in 4; the bulk generator's
process; the drain and stop). With --duration 5 --repeats 2: 9 x 2 x 25 s = ~7.5 min,
plus ~15 s for the floor: within one 10-minute device call, not by much; --scenarios
splits it across calls. With the defaults (10 s, 3 repetitions): ~13.5 min, two calls.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gpu_utilisation import UtilisationSampler

from edged.backends.cuda import cuda_available, device_info
from edged.bench import Stream, run_load
from edged.config.classes import ClassConfig
from edged.launch import DaemonProcess
from edged.models.repository import discover

ROOT = Path(__file__).resolve().parent.parent
RESULTS_MARK = "<!-- results: written by bench/gpu_bench.py -->"
ONE_STREAM = [sys.executable, str(ROOT / "bench" / "one_stream.py")]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    backend: str = "onnxruntime-cuda"
    realtime_priority: int = -1
    bulk_priority: int = 0
    realtime: bool = True  # offer realtime's load
    bulk: bool = True  # offer bulk's load, from a process of its own
    one_stream: bool = False  # launched through bench/one_stream.py
    bulk_sms: int = 0  # classes.bulk.sm_count: a green context; 0: the whole device
    bulk_rate_factor: float = 1.0  # times --bulk-rate
    preemption: bool = True  # classes.bulk yields and is preemptible (its built-in settings)
    cuda_graph: bool = False  # classes.realtime.cuda_graph

    def config_text(self) -> str:
        bulk_precedence = "" if self.preemption else "yields = false\npreemptible = false\n"
        return f"""
[server]
backend = "{self.backend}"
default_class = "realtime"
model_repository = "{ROOT / "engines"}"

[classes.realtime]
stream_priority = {self.realtime_priority}
max_batch = 4
inline_max_us = 0
arena_cap_mb = 512
cuda_graph = {str(self.cuda_graph).lower()}

[classes.bulk]
stream_priority = {self.bulk_priority}
sm_count = {self.bulk_sms}
max_batch = 16
batch_wait_us = 500
queue_capacity = 512
arena_cap_mb = 1024
{bulk_precedence}"""


# Bulk's SMs in the green-context scenario: of an H100's or H200's 132, a multiple of 8
# (Hopper's partition granularity), leaving realtime 36 that bulk never occupies.
BULK_SMS = 96
BULK_ALONE, BULK_ALONE_2X = "bulk alone", "bulk alone at 2x rate"
SCENARIOS = (
    Scenario("realtime alone", bulk=False),
    Scenario("with bulk, priority streams"),
    Scenario("with bulk, priority streams, preemption off", preemption=False),
    Scenario("with bulk, priority streams, realtime CUDA graphs", cuda_graph=True),
    Scenario("with bulk, own streams, all priority 0", realtime_priority=0),
    Scenario("with bulk, one shared stream", "onnxruntime-cuda-one-stream", 0, one_stream=True),
    Scenario(f"with bulk in a green context of {BULK_SMS} SMs", bulk_sms=BULK_SMS),
    Scenario(BULK_ALONE, realtime=False),
    Scenario(BULK_ALONE_2X, realtime=False, bulk_rate_factor=2.0),
)
SATURATED_WITHIN = 0.10  # bulk saturates: twice the offered rate adds at most this share of rows/s


def scenario(
    spec: Scenario, streams: tuple[Stream, Stream], inputs: dict[str, Any], duration_s: float
) -> dict[str, Any]:
    realtime, bulk = streams[0], streams[1].scaled(spec.bulk_rate_factor)
    with tempfile.TemporaryDirectory(prefix="edged-gpu-") as folder:
        config = Path(folder) / "edged.toml"
        config.write_text(spec.config_text())
        endpoint = f"ipc://{folder}/d.sock"
        log = Path(folder) / "daemon.log"
        program = ONE_STREAM if spec.one_stream else None
        with DaemonProcess([endpoint], config=config, log_path=log, program=program) as daemon:
            daemon.wait_serving(timeout_s=300)
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as other:
                # Bulk's generator: its own process and socket. A first empty run imports
                # and connects there, so both loads start within milliseconds of each other.
                other.submit(run_load, endpoint, [], inputs, 0.0).result()
                with UtilisationSampler() as utilisation:
                    bulk_rows = (
                        other.submit(run_load, endpoint, [bulk], inputs, duration_s, seed=1) if spec.bulk else None
                    )
                    rows = run_load(endpoint, [realtime], inputs, duration_s) if spec.realtime else []
                    if bulk_rows is not None:
                        rows += bulk_rows.result(timeout=duration_s + 120)
    for row in rows:
        stream = realtime if row["class"] == realtime.klass else bulk
        row["sent_rps"] = row["sent"] / duration_s
        row["ok_rows_per_s"] = row["ok"] * stream.rows / duration_s
    return {
        "scenario": spec.name,
        "classes": rows,
        "gpu_util_pct": utilisation.median,
        "gpu_util_samples": utilisation.samples,
    }


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
        utilisation = [run["gpu_util_pct"] for run in runs if run.get("gpu_util_pct") is not None]
        median_util = statistics.median(utilisation) if utilisation else None
        table.append({"scenario": runs[0]["scenario"], "classes": rows, "gpu_util_pct": median_util})
    return table


def saturation(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Does bulk saturate the GPU? Its achieved rows/s alone at twice the offered rate
    against alone at the rate: within SATURATED_WITHIN, more load buys nothing. When the
    generator could not send much more at twice the rate, the comparison says nothing."""
    by_name = {result["scenario"]: result for result in results}
    if BULK_ALONE not in by_name or BULK_ALONE_2X not in by_name:
        return None
    once, twice = (next(r for r in by_name[n]["classes"] if r["class"] == "bulk") for n in (BULK_ALONE, BULK_ALONE_2X))
    rise = twice["ok_rows_per_s"] / once["ok_rows_per_s"] - 1 if once["ok_rows_per_s"] else float("inf")
    sent_rise = twice["sent_rps"] / once["sent_rps"] - 1 if once["sent_rps"] else 0.0
    figures = (
        f"{once['ok_rows_per_s']:.0f} rows/s at the rate, {twice['ok_rows_per_s']:.0f} at twice it ({rise:+.0%}; "
        f"sent {once['sent_rps']:.0f}/s and {twice['sent_rps']:.0f}/s)"
    )
    if sent_rise < 0.5:
        verdict = f"bulk saturates: UNKNOWN: the generator sent only {sent_rise:+.0%} more at twice the rate: {figures}"
        return {"saturated": None, "rise": rise, "sent_rise": sent_rise, "verdict": verdict}
    saturated = rise <= SATURATED_WITHIN
    verdict = f"bulk saturates: {'yes' if saturated else 'NO'} (within {SATURATED_WITHIN:.0%}): {figures}"
    return {"saturated": saturated, "rise": rise, "sent_rise": sent_rise, "verdict": verdict}


def format_table(device: str, repeats: int, results: list[dict[str, Any]], floor_us: dict[str, float]) -> str:
    lines = [
        f"device: {device}; median of {repeats} interleaved repetitions",
        "| scenario | class | offered/s | sent/s | ok | shed | good/s | ok rows/s | p50 ms | p99 ms | p99.9 ms "
        "| GPU util % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        util = result.get("gpu_util_pct")
        util_text = "-" if util is None else f"{util:.0f}"
        for row in result["classes"]:
            lat = row["latency_us"]
            lines.append(
                f"| {result['scenario']} | {row['class']} | {row['offered_rps']:.0f} | {row['sent_rps']:.0f} | "
                f"{row['ok']:.0f} | {row['overloaded']:.0f} | {row['goodput_rps']:.1f} | {row['ok_rows_per_s']:.0f} | "
                + " | ".join(f"{lat[k] / 1000:.3f}" for k in ("p50", "p99", "p999"))
                + f" | {util_text} |"
            )
    lines.append(
        "| floor (in-process runner) | realtime | - | - | - | - | - | - | "
        + " | ".join(f"{floor_us[k] / 1000:.3f}" for k in ("p50", "p99", "p999"))
        + " | - |"
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
    parser.add_argument(
        "--scenarios", type=scenario_numbers, default=None, help="run only these, by number from 1: 1,2,8,9"
    )
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
    chosen = [SCENARIOS[n - 1] for n in args.scenarios] if args.scenarios else list(SCENARIOS)
    repetitions = []
    for repetition in range(args.repeats):
        print(f"repetition {repetition + 1} of {args.repeats}", file=sys.stderr)
        repetitions.append([scenario(spec, streams, inputs, args.duration) for spec in chosen])
    floor_us = floor(args.realtime_model, runs=5000)
    table = medians(repetitions)
    text = format_table(device, args.repeats, table, floor_us)
    saturated = saturation(table)
    record = {
        "device": device,
        "duration_s": args.duration,
        "repetitions": repetitions,
        "floor_us": floor_us,
        "bulk_saturation": saturated,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu-bench.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / "gpu-bench.md").write_text(text + "\n")
    if args.docs:
        doc = ROOT / "docs" / "benchmarks-gpu.md"
        method = doc.read_text().split(RESULTS_MARK)[0]
        stamp = time.strftime("%Y-%m-%d")
        doc.write_text(f"{method}{RESULTS_MARK}\n\n## Results ({stamp}, {args.duration:.0f} s per run)\n\n{text}\n")
    print(text)
    if saturated is not None:
        print(saturated["verdict"])  # the last line: bench/gpu_verify.sh's table shows it
        return 0 if saturated["saturated"] else 1
    return 0


def scenario_numbers(text: str) -> list[int]:
    numbers = [int(part) for part in text.split(",") if part.strip()]
    if not numbers or not all(1 <= n <= len(SCENARIOS) for n in numbers):
        raise argparse.ArgumentTypeError(f"scenario numbers from 1 to {len(SCENARIOS)}, comma-separated: {text!r}")
    return numbers


if __name__ == "__main__":
    sys.exit(main())
