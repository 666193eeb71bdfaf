"""The GPU benchmark's scenarios (bench/gpu_bench.py runs them): each scenario's
configuration, one run of it against a fresh daemon with bulk load from a process of its
own, and the in-process floor (edged.loadgen.gpu_table sums them up). It runs from a
checkout: the models are the repository beside the package."""

from __future__ import annotations

import argparse
import multiprocessing
import re
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


# Two bulk workers, each on a stream of its own, so that one's host work between batches
# (copies, the reply) overlaps the other's kernels. With one, bulk alone left the H200
# idle 17% of the time (NVML 83%), and the isolation figures were read on a GPU not busy.
BULK_WORKERS = 2
# Split between bulk's 6 sessions (2 workers and the inline path, for each of 2 models):
# bulk-heavy's 16-row activations take 90 MiB a buffer, and 1 GiB over 6 did not hold them.
BULK_ARENA_MB = 3072
# How long bulk's senders wait for replies after the run: bulk's queue holds ~2 s of work
# on an H200, and the generator's 2 s counted 3 replies lost that came after 2.02 s.
BULK_PATIENCE_MS = 30_000.0


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
    bulk_yields: bool = True  # classes.bulk.yields, its built-in setting; off, bulk's calls are uncapped too
    cuda_graph: bool = False  # classes.realtime.cuda_graph

    def config_text(self, repository: Path = ENGINES) -> str:
        bulk_precedence = "" if self.bulk_yields else "yields = false\n"
        return f"""
[server]
backend = "{self.backend}"
default_class = "realtime"
model_repository = "{repository}"

[classes.realtime]
stream_priority = {self.realtime_priority}
max_batch = 4
inline_max_us = 0
arena_cap_mb = 512
cuda_graph = {str(self.cuda_graph).lower()}

[classes.bulk]
stream_priority = {self.bulk_priority}
sm_count = {self.bulk_sms}
workers = {BULK_WORKERS}
max_batch = 16
batch_wait_us = 500
queue_capacity = 512
arena_cap_mb = {BULK_ARENA_MB}
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
    Scenario("with bulk, priority streams, yield off", bulk_yields=False),
    Scenario("with bulk, priority streams, realtime CUDA graphs", cuda_graph=True),
    Scenario("with bulk, own streams, all priority 0", realtime_priority=0),
    Scenario("with bulk, one shared stream", "onnxruntime-cuda-one-stream", 0, one_stream=True),
    Scenario(BULK_ALONE, realtime=False),
    Scenario(BULK_ALONE_2X, realtime=False, bulk_rate_factor=2.0),
    Scenario(f"with bulk in a green context of {BULK_SMS} SMs", bulk_sms=BULK_SMS),
)


@dataclass(frozen=True, slots=True)
class Load:
    """What every run of a benchmark offers: the two streams, the inputs by model, the
    model repository, and how many processes send bulk's share (each its own socket)."""

    streams: tuple[Stream, Stream]
    inputs: dict[str, Any]
    duration_s: float
    repository: Path = ENGINES
    bulk_senders: int = 1


# What the daemon's log shows of ONNX Runtime (at EDGED_ORT_LOG_LEVEL 1 or below): lines
# that say a CUDA graph was captured or replayed, and a session that copied a shared weight.
LOG_FINDINGS = {
    "cuda_graph_lines": re.compile(r"cuda ?graph", re.IGNORECASE),
    "initializer_copied": re.compile(r"Cannot use user supplied initializer"),
    "cpu_node_lines": re.compile(r"nodes? (are|were|is) (placed|assigned) on .*CPU", re.IGNORECASE),
}


def log_findings(text: str) -> dict[str, int]:
    return {name: len(pattern.findall(text)) for name, pattern in LOG_FINDINGS.items()}


def scenario(spec: Scenario, load: Load, log_path: Path | None = None) -> dict[str, Any]:
    """One run of `spec` against a fresh daemon. Whatever happens, the daemon's log is kept
    at `log_path` and what it shows is counted; a run that fails returns its error."""
    realtime, bulk = load.streams[0], load.streams[1].scaled(spec.bulk_rate_factor)
    result: dict[str, Any] = {"scenario": spec.name, "error": "ended before it finished"}
    with tempfile.TemporaryDirectory(prefix="edged-gpu-") as folder:
        log = Path(folder) / "daemon.log"
        try:
            rows, utilisation, figures, models = _load(spec, folder, log, (realtime, bulk), load)
            for row in rows:
                stream = realtime if row["class"] == realtime.klass else bulk
                row["sent_rps"] = row["sent"] / load.duration_s
                row["ok_rows_per_s"] = row["ok"] * stream.rows / load.duration_s
                # The daemon's own compute time per call, beside the client's round trips.
                row["compute_p50_us"] = figures[row["class"]]["latency_us"]["compute"]["p50"]
            result = {
                "scenario": spec.name,
                "classes": rows,
                "gpu_util_pct": utilisation.median,
                "gpu_util_samples": utilisation.samples,
                # Any node of a served model on the CPU, and the figure is not a GPU figure.
                "cpu_nodes": {m["name"]: m.get("cpu_nodes") for m in models},
            }
        except Exception as exc:  # one scenario's failure must not cost the others' results
            result = {"scenario": spec.name, "error": f"{type(exc).__name__}: {exc}"}
        finally:  # also when the benchmark is ended at its limit (a BaseException) mid-run
            text = log.read_text(errors="replace") if log.exists() else ""
            result["daemon_log_findings"] = log_findings(text)
            if log_path is not None and log.exists():
                log_path.parent.mkdir(parents=True, exist_ok=True)
                log_path.write_text(text)
                result["daemon_log"] = str(log_path)
    return result


def _load(
    spec: Scenario, folder: str, log: Path, streams: tuple[Stream, Stream], load: Load
) -> tuple[list[dict[str, Any]], UtilisationSampler, dict[str, Any], list[dict[str, Any]]]:
    """The daemon, both loads, and the daemon's own figures per class and models at the end."""
    realtime, bulk = streams
    config = Path(folder) / "edged.toml"
    config.write_text(spec.config_text(load.repository))
    endpoint = f"ipc://{folder}/d.sock"
    program = ONE_STREAM if spec.one_stream else None
    senders = load.bulk_senders if spec.bulk else 0
    inputs, duration_s = load.inputs, load.duration_s
    with DaemonProcess([endpoint], config=config, log_path=log, program=program) as daemon:
        daemon.wait_serving(timeout_s=START_S)
        with ProcessPoolExecutor(max(senders, 1), mp_context=multiprocessing.get_context("spawn")) as others:
            # Bulk's generators: each its own process and socket. A first empty run imports
            # and connects there, so the loads start within milliseconds of each other.
            for ready in [others.submit(run_load, endpoint, [], inputs, 0.0) for _ in range(max(senders, 1))]:
                ready.result()
            share = bulk.scaled(1 / max(senders, 1))
            with UtilisationSampler() as utilisation:
                sent = [
                    others.submit(
                        run_load, endpoint, [share], inputs, duration_s, lost_after_ms=BULK_PATIENCE_MS, seed=1 + i
                    )
                    for i in range(senders)
                ]
                rows = run_load(endpoint, [realtime], inputs, duration_s) if spec.realtime else []
                if sent:
                    rows.append(merged([f.result(timeout=duration_s + 120)[0] for f in sent]))
        with Client(endpoint, timeout_ms=10_000) as client:
            figures, models = client.stats()["classes"], client.models()
    return rows, utilisation, figures, models


def merged(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Bulk's senders summed: counts and rates add up; each latency percentile is the worst
    sender's (an upper bound on the merged one, and the table says bulk's are so)."""
    first = rows[0]
    row = {"class": first["class"], "model": first["model"], "senders": len(rows)}
    for key in (
        "offered_rps",
        "sent",
        "ok",
        "overloaded",
        "deadline_exceeded",
        "other",
        "lost",
        "duplicated",
        "goodput_rps",
    ):
        row[key] = sum(r[key] for r in rows)
    row["ok_fraction"] = row["ok"] / row["sent"] if row["sent"] else 0.0
    row["latency_us"] = {k: max(r["latency_us"][k] for r in rows) for k in first["latency_us"]}
    return row


def run_scenarios(
    chosen: list[Scenario],
    load: Load,
    repeats: int,
    out: Path,
    save: Callable[[list[list[dict[str, Any]]]], None],
) -> list[list[dict[str, Any]]]:
    """Every scenario `repeats` times, interleaved; `save` gets the repetitions so far after
    each run, so a call cut short keeps what it measured. Each run's daemon log is kept in
    `out` as gpu-bench-N-R.log (N the scenario's number, R the repetition)."""
    repetitions: list[list[dict[str, Any]]] = []
    for repetition in range(repeats):
        print(f"repetition {repetition + 1} of {repeats}", file=sys.stderr)
        repetitions.append([])
        for spec in chosen:
            # A scenario of the caller's own: numbered after the built-in ones.
            number = SCENARIOS.index(spec) + 1 if spec in SCENARIOS else len(SCENARIOS) + 1 + chosen.index(spec)
            log_path = out / f"gpu-bench-{number}-{repetition + 1}.log"
            repetitions[-1].append(scenario(spec, load, log_path))
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


def scenario_numbers(text: str) -> list[int]:
    """`--scenarios`: numbers from 1, comma-separated."""
    numbers = [int(part) for part in text.split(",") if part.strip()]
    if not numbers or not all(1 <= n <= len(SCENARIOS) for n in numbers):
        raise argparse.ArgumentTypeError(f"scenario numbers from 1 to {len(SCENARIOS)}, comma-separated: {text!r}")
    return numbers
