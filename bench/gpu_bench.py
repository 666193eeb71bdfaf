"""GPU benchmark of the ONNX Runtime CUDA backend, in one call on a GPU machine.

    python bench/gpu_bench.py [--duration 10] [--repeats 3] [--scenarios 1,2,...] [--out DIR] [--docs]

NOT YET RUN: written on machines with no GPU (see bench/gpu_verify.sh). Scenarios,
each against a fresh daemon, run in turn and repeated `--repeats` times, interleaved
(A B C D, A B C D, ...), so a drift of the machine falls on every scenario alike:
1. realtime alone (its lane on a stream of priority -1);
2. realtime beside a saturating bulk load, each class on its own priority stream, bulk
   yielding, its calls capped by max_call_ms (its built-in settings);
3. the same with bulk's yield off (classes.bulk yields = false, which leaves its calls
   uncapped too): what yielding buys realtime, 2 against 3;
4. the same as 2 with realtime's CUDA graphs on (classes.realtime.cuda_graph = true);
5. the same as 2 with each lane on its own stream, all at priority 0;
6. the same with every lane on ONE shared stream (bench/one_stream.py): the ablation;
7. bulk alone, and 8. bulk alone at twice its rate: "bulk saturates" holds when the
   second achieves at most SATURATED_WITHIN more rows/s than the first;
9. priority streams, with bulk's lane in a green context of BULK_SMS SMs
   (classes.bulk.sm_count, edged.backends.green), realtime on the whole device: last,
   and in a call of its own after `bench/gpu_checks.py green` passed.
Bulk load comes from a process and a socket of its own, so a saturated bulk generator
never delays realtime's sends. During each scenario's load, nvidia-smi samples GPU
utilisation every 100 ms (its median per scenario; none without nvidia-smi). Then the
floor: the realtime model in this process, on the same backend runner at batch 1, no
daemon in between. Prints a table last (median over the repetitions; each class's
offered, sent and achieved rates). DIR/gpu-bench.json is rewritten after every run, so a
call cut short keeps what it measured; a run that fails is recorded with its error, its
daemon's log kept as DIR/gpu-bench-N-R.log, and the others go on (exit code 1). The
table goes to DIR/gpu-bench.md; with --docs, also the results section of
docs/benchmarks-gpu.md.

Time, estimated (nothing here has been timed on a GPU): per scenario and repetition, the
load's --duration plus ~20 s (a fresh daemon: CUDA context, 4 sessions, warm-up of every
batch size with cuDNN's algorithm search, CUDA graph capture in 4; the bulk generator's
process; the drain and stop). With --duration 5 --repeats 2: ~50 s per scenario, so
bench/gpu_verify.sh splits them over three calls (1-4, 5-8, 9), each well within 10 min.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from edged.backends.cuda import cuda_available, device_info
from edged.loadgen.gpu_scenarios import SCENARIOS, floor, run_scenarios, scenario_numbers
from edged.loadgen.gpu_table import format_table, medians, saturation
from edged.loadgen.sweep import Stream
from edged.models.repository import discover

ROOT = Path(__file__).resolve().parent.parent
RESULTS_MARK = "<!-- results: written by bench/gpu_bench.py -->"


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
        "--scenarios", type=scenario_numbers, default=None, help="run only these, by number from 1: 1,2,7,8"
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
    args.out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "device": device,
        "duration_s": args.duration,
        "scenarios": [spec.name for spec in chosen],
        "repetitions": [],
        "floor_us": None,
        "bulk_saturation": None,
    }

    def save(repetitions: list[list[dict[str, Any]]]) -> None:
        record["repetitions"] = repetitions
        write_json(args.out / "gpu-bench.json", record)

    repetitions = run_scenarios(chosen, streams, inputs, args.duration, args.repeats, args.out, save)
    try:
        record["floor_us"] = floor(args.realtime_model, runs=5000)
    except Exception as exc:  # the scenarios' figures stand without it
        record["floor_error"] = f"{type(exc).__name__}: {exc}"
    table = medians(repetitions)
    text = format_table(device, args.repeats, table, record["floor_us"])
    saturated = record["bulk_saturation"] = saturation(table)
    write_json(args.out / "gpu-bench.json", record)
    (args.out / "gpu-bench.md").write_text(text + "\n")
    if args.docs:
        doc = ROOT / "docs" / "benchmarks-gpu.md"
        method = doc.read_text().split(RESULTS_MARK)[0]
        stamp = time.strftime("%Y-%m-%d")
        doc.write_text(f"{method}{RESULTS_MARK}\n\n## Results ({stamp}, {args.duration:.0f} s per run)\n\n{text}\n")
    print(text)
    failed = [result["scenario"] for result in table if result["failed"]]
    if saturated is not None:
        print(saturated["verdict"])
    if failed:
        print(f"FAILED runs in: {', '.join(failed)} (their daemon logs: {args.out}/gpu-bench-N-R.log)")
        return 1
    if saturated is not None:
        return 0 if saturated["saturated"] else 1
    return 0


def write_json(path: Path, record: dict[str, Any]) -> None:
    """Replace `path` whole: a call cut short leaves the last complete record, never half of one."""
    partial = path.with_suffix(".json.part")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    partial.replace(path)


if __name__ == "__main__":
    sys.exit(main())
