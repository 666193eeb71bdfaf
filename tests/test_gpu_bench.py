"""bench/gpu_bench.py's harness on the CPU backend: a scenario with bulk load from a
process of its own, the achieved rates, the medians over repetitions and the table.
What it shows is the harness, not any GPU figure (none has been measured)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from edged.bench import Stream
from edged.models.repository import discover

ROOT = Path(__file__).resolve().parents[1]


def gpu_bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "bench" / "gpu_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_bench_harness_on_the_cpu_runs_realtime_beside_bulk_from_another_process() -> None:
    bench = gpu_bench()
    inputs = {m.name: [s.to_wire() for s in m.signature.inputs] for m in discover(ROOT / "engines", "onnxruntime")}
    streams = (Stream("realtime", "mlp-light", 100.0, 1000.0), Stream("bulk", "mlp-light", 50.0, 5000.0, rows=16))
    spec = ("cpu", "onnxruntime", 0, 0, True, False)
    result = bench.scenario(spec, streams, inputs, duration_s=1.0)
    realtime, bulk = result["classes"]
    assert (realtime["class"], bulk["class"]) == ("realtime", "bulk")
    assert realtime["ok"] > 0 and bulk["ok"] > 0
    assert bulk["ok_rows_per_s"] == bulk["ok"] * 16 / 1.0 and bulk["sent_rps"] == bulk["sent"] / 1.0
    table = bench.format_table("CPU", 2, bench.medians([[result], [result]]), {"p50": 1.0, "p99": 2.0, "p999": 3.0})
    assert "median of 2 interleaved repetitions" in table and "| cpu | bulk | 50 |" in table
