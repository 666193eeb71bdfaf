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
import sys
import time
from pathlib import Path

from edged.backends.cuda import cuda_available, device_info
from edged.loadgen.gpu_scenarios import SCENARIOS, floor, format_table, medians, saturation, scenario, scenario_numbers
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


if __name__ == "__main__":
    sys.exit(main())
