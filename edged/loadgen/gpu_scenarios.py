"""The GPU benchmark's scenarios (bench/gpu_bench.py runs them): each scenario's
configuration, one run of it against a fresh daemon with bulk load from a process of its
own, the in-process floor, the medians over repetitions, the "bulk saturates" verdict and
the table. It runs from a checkout: the models are the repository beside the package."""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edged.client import Client
from edged.config.classes import ClassConfig
from edged.config.file import default_repository
from edged.loadgen.gpu_utilisation import UtilisationSampler
from edged.loadgen.launch import DaemonProcess
from edged.loadgen.sweep import Stream, run_load
from edged.models.repository import discover

ENGINES = default_repository()
START_S = 180  # a daemon not serving by then has failed (its log is kept)
ONE_STREAM = [sys.executable, str(ENGINES.parent / "bench" / "one_stream.py")]


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
model_repository = "{ENGINES}"

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
# The green context last: ONNX Runtime on a green context's stream is the least known
# part, run in a call of its own once bench/gpu_checks.py green has passed.
SCENARIOS = (
    Scenario("realtime alone", bulk=False),
    Scenario("with bulk, priority streams"),
    Scenario("with bulk, priority streams, preemption off", preemption=False),
    Scenario("with bulk, priority streams, realtime CUDA graphs", cuda_graph=True),
    Scenario("with bulk, own streams, all priority 0", realtime_priority=0),
    Scenario("with bulk, one shared stream", "onnxruntime-cuda-one-stream", 0, one_stream=True),
    Scenario(BULK_ALONE, realtime=False),
    Scenario(BULK_ALONE_2X, realtime=False, bulk_rate_factor=2.0),
    Scenario(f"with bulk in a green context of {BULK_SMS} SMs", bulk_sms=BULK_SMS),
)
SATURATED_WITHIN = 0.10  # bulk saturates: twice the offered rate adds at most this share of rows/s


def scenario(
    spec: Scenario,
    streams: tuple[Stream, Stream],
    inputs: dict[str, Any],
    duration_s: float,
    failed_log: Path | None = None,
) -> dict[str, Any]:
    """One run of `spec` against a fresh daemon. A run that fails returns its error, and
    its daemon's log is kept at `failed_log`; the daemon's log is dropped otherwise."""
    realtime, bulk = streams[0], streams[1].scaled(spec.bulk_rate_factor)
    with tempfile.TemporaryDirectory(prefix="edged-gpu-") as folder:
        log = Path(folder) / "daemon.log"
        try:
            rows, utilisation, figures = _load(spec, folder, log, (realtime, bulk), inputs, duration_s)
        except Exception as exc:  # one scenario's failure must not cost the others' results
            kept = None
            if failed_log is not None and log.exists():
                failed_log.parent.mkdir(parents=True, exist_ok=True)
                failed_log.write_bytes(log.read_bytes())
                kept = str(failed_log)
            return {"scenario": spec.name, "error": f"{type(exc).__name__}: {exc}", "daemon_log": kept}
    for row in rows:
        stream = realtime if row["class"] == realtime.klass else bulk
        row["sent_rps"] = row["sent"] / duration_s
        row["ok_rows_per_s"] = row["ok"] * stream.rows / duration_s
        # Measured, not assumed: on a GPU a cancelled call still waits for what its stream
        # already holds, so its time until it stopped tells whether preemption bought anything.
        row["preempted"] = figures[row["class"]]["preempted"]
        row["compute_p50_us"] = figures[row["class"]]["latency_us"]["compute"]["p50"]
    return {
        "scenario": spec.name,
        "classes": rows,
        "gpu_util_pct": utilisation.median,
        "gpu_util_samples": utilisation.samples,
    }


def _load(
    spec: Scenario, folder: str, log: Path, streams: tuple[Stream, Stream], inputs: dict[str, Any], duration_s: float
) -> tuple[list[dict[str, Any]], UtilisationSampler, dict[str, Any]]:
    """The daemon, both loads, and the daemon's own figures per class at the end."""
    realtime, bulk = streams
    config = Path(folder) / "edged.toml"
    config.write_text(spec.config_text())
    endpoint = f"ipc://{folder}/d.sock"
    program = ONE_STREAM if spec.one_stream else None
    with DaemonProcess([endpoint], config=config, log_path=log, program=program) as daemon:
        daemon.wait_serving(timeout_s=START_S)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as other:
            # Bulk's generator: its own process and socket. A first empty run imports
            # and connects there, so both loads start within milliseconds of each other.
            other.submit(run_load, endpoint, [], inputs, 0.0).result()
            with UtilisationSampler() as utilisation:
                bulk_rows = other.submit(run_load, endpoint, [bulk], inputs, duration_s, seed=1) if spec.bulk else None
                rows = run_load(endpoint, [realtime], inputs, duration_s) if spec.realtime else []
                if bulk_rows is not None:
                    rows += bulk_rows.result(timeout=duration_s + 120)
        with Client(endpoint, timeout_ms=10_000) as client:
            figures = client.stats()["classes"]
    return rows, utilisation, figures


def run_scenarios(
    chosen: list[Scenario],
    streams: tuple[Stream, Stream],
    inputs: dict[str, Any],
    duration_s: float,
    repeats: int,
    out: Path,
    save: Callable[[list[list[dict[str, Any]]]], None],
) -> list[list[dict[str, Any]]]:
    """Every scenario `repeats` times, interleaved; `save` gets the repetitions so far after
    each run, so a call cut short keeps what it measured. A failed run's daemon log is kept
    in `out` as gpu-bench-N-R.log (N the scenario's number, R the repetition)."""
    repetitions: list[list[dict[str, Any]]] = []
    for repetition in range(repeats):
        print(f"repetition {repetition + 1} of {repeats}", file=sys.stderr)
        repetitions.append([])
        for spec in chosen:
            number = SCENARIOS.index(spec) + 1 if spec in SCENARIOS else 0
            failed_log = out / f"gpu-bench-{number}-{repetition + 1}.log"
            repetitions[-1].append(scenario(spec, streams, inputs, duration_s, failed_log))
            save(repetitions)
    return repetitions


def floor(model_name: str, runs: int) -> dict[str, float]:
    """The realtime model through the same runner, in this process, one request at a time."""
    from edged.backends.onnxruntime_cuda import OnnxRuntimeCuda

    model = next(m for m in discover(ENGINES, "onnxruntime") if m.name == model_name)
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
    """Per scenario and class, the median over the repetitions of each figure in the table;
    a scenario whose every run failed keeps its first error."""
    table = []
    for every in zip(*repetitions):
        runs = [run for run in every if "classes" in run]
        failed = len(every) - len(runs)
        if not runs:
            table.append(
                {"scenario": every[0]["scenario"], "classes": [], "failed": failed, "error": every[0]["error"]}
            )
            continue
        rows = []
        for per_class in zip(*(run["classes"] for run in runs)):
            row = {"class": per_class[0]["class"], "offered_rps": per_class[0]["offered_rps"]}
            for key in ("sent_rps", "ok", "overloaded", "goodput_rps", "ok_rows_per_s", "compute_p50_us"):
                row[key] = statistics.median(r[key] for r in per_class)
            latency = [r["latency_us"] for r in per_class]
            row["latency_us"] = {k: statistics.median(lat[k] for lat in latency) for k in ("p50", "p99", "p999")}
            row["preempted_calls"] = statistics.median(r["preempted"]["calls"] for r in per_class)
            stopped = [
                r["preempted"]["work_us"] / r["preempted"]["calls"] for r in per_class if r["preempted"]["calls"]
            ]
            row["preempted_us_each"] = statistics.median(stopped) if stopped else None
            rows.append(row)
        utilisation = [run["gpu_util_pct"] for run in runs if run.get("gpu_util_pct") is not None]
        median_util = statistics.median(utilisation) if utilisation else None
        table.append({"scenario": runs[0]["scenario"], "classes": rows, "gpu_util_pct": median_util, "failed": failed})
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


def format_table(device: str, repeats: int, results: list[dict[str, Any]], floor_us: dict[str, float] | None) -> str:
    """The medians as a Markdown table. "preempted" is the class's calls cancelled for a higher
    class, and the median time each ran until it stopped beside its calls' median: about
    equal, and preemption bought nothing (on a GPU, a cancelled call waits for its stream)."""
    lines = [
        f"device: {device}; median of {repeats} interleaved repetitions",
        "| scenario | class | offered/s | sent/s | ok | shed | good/s | ok rows/s | p50 ms | p99 ms | p99.9 ms "
        "| GPU util % | preempted (ms until stopped / call p50) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        if not result["classes"]:
            lines.append(f"| {result['scenario']} | FAILED ({result['failed']} of {repeats}): {result['error']} |")
            continue
        util = result.get("gpu_util_pct")
        util_text = "-" if util is None else f"{util:.0f}"
        failed = f" ({result['failed']} of {repeats} runs failed)" if result.get("failed") else ""
        for row in result["classes"]:
            lat = row["latency_us"]
            lines.append(
                f"| {result['scenario']}{failed} | {row['class']} | {row['offered_rps']:.0f} | {row['sent_rps']:.0f} | "
                f"{row['ok']:.0f} | {row['overloaded']:.0f} | {row['goodput_rps']:.1f} | {row['ok_rows_per_s']:.0f} | "
                + " | ".join(f"{lat[k] / 1000:.3f}" for k in ("p50", "p99", "p999"))
                + f" | {util_text} | {_preempted(row)} |"
            )
    if floor_us is not None:
        lines.append(
            "| floor (in-process runner) | realtime | - | - | - | - | - | - | "
            + " | ".join(f"{floor_us[k] / 1000:.3f}" for k in ("p50", "p99", "p999"))
            + " | - | - |"
        )
    return "\n".join(lines)


def _preempted(row: dict[str, Any]) -> str:
    each = row.get("preempted_us_each")
    if each is None:
        return "0"
    return f"{row['preempted_calls']:.0f} ({each / 1000:.2f} / {row['compute_p50_us'] / 1000:.2f})"


def scenario_numbers(text: str) -> list[int]:
    """`--scenarios`: numbers from 1, comma-separated."""
    numbers = [int(part) for part in text.split(",") if part.strip()]
    if not numbers or not all(1 <= n <= len(SCENARIOS) for n in numbers):
        raise argparse.ArgumentTypeError(f"scenario numbers from 1 to {len(SCENARIOS)}, comma-separated: {text!r}")
    return numbers
