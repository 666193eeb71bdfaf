"""GPU benchmark of the ONNX Runtime CUDA backend, in one call on a GPU machine.

    python bench/gpu_bench.py [--duration 10] [--repeats 3] [--scenarios 1,2,...] [--out DIR]

Ran on an NVIDIA H200 and an NVIDIA H100 (2026-11-27; docs/benchmarks-gpu.md), through
bench/gpu_verify.sh. Scenarios,
each against a fresh daemon, run in the order given, repeated `--repeats` times,
interleaved (A B C D, A B C D, ...), so a drift of the machine falls on every scenario alike:
1. realtime alone (mlp-light, its lane on a stream of priority -1);
2. realtime beside a saturating bulk load (bulk-heavy, 16 rows a request, from
   --bulk-senders processes), each class on its own priority stream, bulk yielding,
   its calls capped by max_call_ms (its built-in settings): 1 against 2 is the headline;
3. the same with bulk's yield off (classes.bulk yields = false, which leaves its calls
   uncapped too): what yielding buys realtime, 2 against 3;
4. the same as 2 with realtime's CUDA graphs on (classes.realtime.cuda_graph = true);
5. the same as 2 with each lane on its own stream, all at priority 0;
6. the same with every lane on ONE shared stream (bench/one_stream.py): the ablation;
7. bulk alone, and 8. bulk alone at twice its rate: "bulk saturates" holds when the
   second achieves at most SATURATED_WITHIN more rows/s than the first, and "bulk keeps
   the GPU busy" when 7's median NVML utilisation is at least BUSY_PCT: no isolation
   figure means anything before both;
9. priority streams, with bulk's lane in a green context of BULK_SMS SMs
   (classes.bulk.sm_count, edged.backends.green), realtime on the whole device.
The bulk model is built at the start (build_scripts/make_bulk_model.py) into a model
repository of its own beside a copy of mlp-light. During each scenario's load,
nvidia-smi samples GPU utilisation every 100 ms. Every run records the `models`
reply's cpu_nodes: a model with a node on the CPU makes the run NOT a GPU figure. Then
the floor: the realtime model in this process, on the same backend runner at batch 1.
DIR/gpu-bench.json is rewritten after every run and every daemon's log is kept as
DIR/gpu-bench-N-R.log, with what it shows of CUDA graphs and copied initializers
counted; a run that fails is recorded with its error and the others go on (exit 1).
The table goes to DIR/gpu-bench.md. docs/benchmarks-gpu.md's results are written by hand
from it and the JSON, one section a machine.

Time, per scenario and repetition: the load's --duration plus about 8-10 s (a fresh
daemon: CUDA context, sessions, warm-up of every batch size with cuDNN's algorithm search,
the senders' processes, the drain and stop). Measured on an H100 with 5 s runs: 13-15 s
a run (2026-11-27).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpu_checks import ENDED, Ended, on_sigterm

from edged.backends.cuda import cuda_available, device_info
from edged.loadgen.gpu_scenarios import SCENARIOS, Load, floor, run_scenarios, scenario_numbers
from edged.loadgen.gpu_table import busy, format_table, gpu_figures, medians, saturation
from edged.loadgen.sweep import Stream
from edged.models.repository import discover

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "build_scripts"))
from make_bulk_model import write_bulk_model  # noqa: E402  (build_scripts/ is no package)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per scenario and repetition")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--realtime-model", default="mlp-light")
    parser.add_argument("--realtime-rate", type=float, default=500.0)
    parser.add_argument("--bulk-rate", type=float, default=800.0, help="requests/s of 16 rows, all senders together")
    parser.add_argument(
        "--bulk-senders", type=int, default=4, help="processes sending bulk's load, each its own socket"
    )
    parser.add_argument("--bulk-channels", type=int, default=256, help="bulk-heavy's width (16 for a CPU rehearsal)")
    parser.add_argument("--bulk-depth", type=int, default=8, help="bulk-heavy's shared-weight layers")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for gpu-bench.json, .md and daemon logs")
    parser.add_argument(
        "--scenarios", type=scenario_numbers, default=None, help="run only these, in this order: 1,2,7,8"
    )
    args = parser.parse_args()
    reason = cuda_available()
    if reason is not None:
        raise SystemExit(f"gpu_bench.py needs a CUDA GPU, and this machine has none usable: {reason}")
    args.out.mkdir(parents=True, exist_ok=True)
    repository = Path(tempfile.mkdtemp(prefix="edged-bench-models-"))  # not in --out: its files are not results
    try:
        return measure(args, repository)
    finally:
        shutil.rmtree(repository, ignore_errors=True)


def measure(args: argparse.Namespace, repository: Path) -> int:
    shutil.copytree(ROOT / "engines" / args.realtime_model, repository / args.realtime_model)
    bulk_model = write_bulk_model(repository, args.bulk_channels, args.bulk_depth).name
    device = device_info(0).name
    inputs = {m.name: [s.to_wire() for s in m.signature.inputs] for m in discover(repository, "onnxruntime")}
    streams = (
        Stream("realtime", args.realtime_model, args.realtime_rate, 20.0),
        Stream("bulk", bulk_model, args.bulk_rate, 5000.0, rows=16),
    )
    load = Load(streams, inputs, args.duration, repository, args.bulk_senders)
    chosen = [SCENARIOS[n - 1] for n in args.scenarios] if args.scenarios else list(SCENARIOS)
    record: dict[str, Any] = {
        "device": device,
        "duration_s": args.duration,
        "bulk_model": {"name": bulk_model, "channels": args.bulk_channels, "depth": args.bulk_depth},
        "bulk_senders": args.bulk_senders,
        "scenarios": [spec.name for spec in chosen],
        "repetitions": [],
        "floor_us": None,
    }

    def save(repetitions: list[list[dict[str, Any]]]) -> None:
        record["repetitions"] = repetitions
        write_json(args.out / "gpu-bench.json", record)

    def cut_short() -> None:  # at its limit: the runs saved so far are summed up all the same, at once
        record["cut_short"] = ENDED
        summarise(record, record["repetitions"], args)

    on_sigterm(cut_short)
    try:
        repetitions = run_scenarios(chosen, load, args.repeats, args.out, save)
    except Ended:
        return 1
    try:
        record["floor_us"] = floor(args.realtime_model, runs=5000)
    except Exception as exc:  # the scenarios' figures stand without it
        record["floor_error"] = f"{type(exc).__name__}: {exc}"
    write_json(args.out / "gpu-bench.json", record)
    try:
        return summarise(record, repetitions, args)
    except Exception as exc:  # the runs are saved; the summary's failure is recorded beside them
        record["summary_error"] = f"{type(exc).__name__}: {exc}"
        write_json(args.out / "gpu-bench.json", record)
        raise


def summarise(record: dict[str, Any], repetitions: list[list[dict[str, Any]]], args: argparse.Namespace) -> int:
    """The table, the verdicts (GPU figures, bulk busy, bulk saturates), and the exit code:
    1 for a failed run or a figure that is not a GPU figure; a verdict of UNKNOWN is no failure."""
    table = medians(repetitions)
    text = format_table(record["device"], args.repeats, table, record["floor_us"])
    verdicts = [gpu_figures(table), busy(table), saturation(table)]
    record["gpu_figures"], record["bulk_busy"], record["bulk_saturation"] = verdicts
    text += "\n\n" + "\n".join(v["verdict"] for v in verdicts if v is not None)
    write_json(args.out / "gpu-bench.json", record)
    (args.out / "gpu-bench.md").write_text(text + "\n")
    print(text)
    failed = [result["scenario"] for result in table if result["failed"]]
    if failed:
        print(f"FAILED runs in: {', '.join(failed)} (their daemon logs: {args.out}/gpu-bench-N-R.log)")
    if "cut_short" in record:
        print(f"CUT SHORT: {record['cut_short']}: the table holds the runs that finished")
    return 1 if failed or not record["gpu_figures"]["gpu"] or "cut_short" in record else 0


def write_json(path: Path, record: dict[str, Any]) -> None:
    """Replace `path` whole: a call cut short leaves the last complete record, never half of one."""
    partial = path.with_suffix(".json.part")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    partial.replace(path)


if __name__ == "__main__":
    sys.exit(main())
