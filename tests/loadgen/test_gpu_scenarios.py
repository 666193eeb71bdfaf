"""The GPU benchmark's harness (edged.loadgen.gpu_scenarios, which bench/gpu_bench.py
runs) on the CPU backend: a scenario with bulk load from a process of its own, the
achieved rates, the medians over repetitions and the table; and without a GPU: the
scenarios' configs, the utilisation sampler on a fake nvidia-smi, the "bulk saturates"
verdict. What it shows is the harness, not any GPU figure (none has been measured)."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path

import pytest
from support import REPO_ROOT, wait_for

from edged.backends import BACKENDS
from edged.config import parse_config
from edged.loadgen import gpu_scenarios, gpu_table
from edged.loadgen.gpu_utilisation import UtilisationSampler, gpu_index, parse_utilisation
from edged.loadgen.sweep import Stream
from edged.models.repository import discover

ROOT = REPO_ROOT


def test_gpu_bench_harness_on_the_cpu_runs_realtime_beside_bulk_from_another_process() -> None:
    inputs = {m.name: [s.to_wire() for s in m.signature.inputs] for m in discover(ROOT / "engines", "onnxruntime")}
    streams = (Stream("realtime", "mlp-light", 100.0, 1000.0), Stream("bulk", "mlp-light", 50.0, 5000.0, rows=16))
    spec = gpu_scenarios.Scenario("cpu", "onnxruntime", 0, 0)
    result = gpu_scenarios.scenario(spec, gpu_scenarios.Load(streams, inputs, 1.0, bulk_senders=2))
    realtime, bulk = result["classes"]
    assert (realtime["class"], bulk["class"]) == ("realtime", "bulk")
    assert realtime["ok"] > 0 and bulk["ok"] > 0
    # Two senders, each its own process and socket, half the rate each: summed.
    assert bulk["senders"] == 2 and bulk["offered_rps"] == 50.0
    assert bulk["ok_rows_per_s"] == bulk["ok"] * 16 / 1.0 and bulk["sent_rps"] == bulk["sent"] / 1.0
    # The CPU backend says nothing of CPU nodes: not a GPU figure.
    assert result["cpu_nodes"] == {"cnn-heavy": None, "mlp-light": None}
    table = gpu_table.format_table(
        "CPU", 2, gpu_table.medians([[result], [result]]), {"p50": 1.0, "p99": 2.0, "p999": 3.0}
    )
    assert "median of 2 interleaved repetitions" in table and "| cpu | bulk | 50 |" in table
    # The daemon's own figures, read before it stops.
    assert bulk["compute_p50_us"] > 0 and "preempted" not in bulk
    assert result["gpu_util_pct"] is None or isinstance(result["gpu_util_pct"], float)  # None: no nvidia-smi here


def test_gpu_bench_bulk_alone_on_the_cpu_offers_bulk_only_at_the_scaled_rate() -> None:
    inputs = {m.name: [s.to_wire() for s in m.signature.inputs] for m in discover(ROOT / "engines", "onnxruntime")}
    streams = (Stream("realtime", "mlp-light", 100.0, 1000.0), Stream("bulk", "mlp-light", 20.0, 5000.0, rows=16))
    spec = gpu_scenarios.Scenario("cpu bulk 2x", "onnxruntime", 0, 0, realtime=False, bulk_rate_factor=2.0)
    (bulk,) = gpu_scenarios.scenario(spec, gpu_scenarios.Load(streams, inputs, 1.0))["classes"]
    assert bulk["class"] == "bulk" and bulk["offered_rps"] == 40.0
    assert bulk["ok"] > 0 and bulk["ok_rows_per_s"] == bulk["ok"] * 16 / 1.0


def test_gpu_bench_harness_on_the_cpu_saves_each_run_and_keeps_a_failed_daemons_log(tmp_path: Path) -> None:
    """A run that fails (here onnxruntime-cuda, which cannot start without a GPU) costs
    neither the runs before it nor the cause: each run is saved as it ends."""
    inputs = {m.name: [s.to_wire() for s in m.signature.inputs] for m in discover(ROOT / "engines", "onnxruntime")}
    streams = (Stream("realtime", "mlp-light", 50.0, 1000.0), Stream("bulk", "mlp-light", 20.0, 5000.0, rows=16))
    specs = [
        gpu_scenarios.Scenario("cpu", "onnxruntime", 0, 0, bulk=False),
        gpu_scenarios.Scenario("cuda without a gpu", bulk=False),
    ]
    saved: list[list[str]] = []

    def save(repetitions: list[list[dict[str, object]]]) -> None:
        saved.append([("error" if "error" in run else "ok") for run in repetitions[-1]])

    repetitions = gpu_scenarios.run_scenarios(specs, gpu_scenarios.Load(streams, inputs, 1.0), 1, tmp_path, save)
    assert saved == [["ok"], ["ok", "error"]]
    failed = repetitions[0][1]
    log = tmp_path / "gpu-bench-11-1.log"  # scenarios of the caller's own: numbered after the built-in 9
    assert failed["daemon_log"] == str(log) and "during start-up" in failed["error"]
    assert 'server.backend = "onnxruntime-cuda" cannot run here' in log.read_text()
    # Every run's daemon log is kept, the successful one's too, with what it shows counted.
    kept = Path(repetitions[0][0]["daemon_log"])
    assert kept == tmp_path / "gpu-bench-10-1.log" and "stopped" in kept.read_text()
    assert repetitions[0][0]["daemon_log_findings"] == {
        "cuda_graph_lines": 0,
        "initializer_copied": 0,
        "cpu_node_lines": 0,
    }
    table = gpu_table.format_table("CPU", 1, gpu_table.medians(repetitions), None)
    assert "| cuda without a gpu | FAILED (1 of 1): RuntimeError: the daemon exited" in table
    assert "| cpu | realtime | 50 |" in table


# --- without a GPU: configs, sampler, verdicts ---------------------------------------------


def test_every_scenario_config_parses_with_what_it_varies(monkeypatch: pytest.MonkeyPatch) -> None:
    # Registered as bench/one_stream.py registers it before it parses the config (server.backend is checked).
    monkeypatch.setitem(BACKENDS, "onnxruntime-cuda-one-stream", "one_stream:OneStreamCuda")
    assert len(gpu_scenarios.SCENARIOS) == 9 and len({s.name for s in gpu_scenarios.SCENARIOS}) == 9
    configs = {s.name: parse_config(tomllib.loads(s.config_text()), base_dir=ROOT) for s in gpu_scenarios.SCENARIOS}
    for name, config in configs.items():
        realtime, bulk = config.class_named("realtime"), config.class_named("bulk")
        assert [c.name for c in config.classes] == ["realtime", "bulk"], name
        assert (realtime.max_batch, bulk.max_batch, realtime.arena_cap_mb) == (4, 16, 512)
        assert (realtime.workers, bulk.workers) == (1, gpu_scenarios.BULK_WORKERS), name
        assert bulk.yields == (name != "with bulk, priority streams, yield off"), name
        assert (bulk.max_call_ms > 0) == bulk.yields, name  # the derived cap is a yielding class's only
        assert realtime.cuda_graph == (name == "with bulk, priority streams, realtime CUDA graphs"), name
        assert bulk.sm_count == (gpu_scenarios.BULK_SMS if "green context" in name else 0), name
    assert configs["with bulk, one shared stream"].backend == "onnxruntime-cuda-one-stream"
    assert configs["with bulk, own streams, all priority 0"].class_named("realtime").stream_priority == 0
    assert configs["with bulk, priority streams"].class_named("realtime").stream_priority == -1
    assert [s.bulk_rate_factor for s in gpu_scenarios.SCENARIOS if not s.realtime] == [1.0, 2.0]
    # The least known part last, so a failure there costs no other scenario.
    assert [s.bulk_sms > 0 for s in gpu_scenarios.SCENARIOS] == [False] * 8 + [True]


def test_utilisation_lines_that_are_not_numbers_are_skipped() -> None:
    samples = parse_utilisation("87\n[N/A]\n 90 \n\nWARNING: infoROM is corrupted\n[Not Supported]\n3\n")
    assert samples == [87.0, 90.0, 3.0]


def fake_nvidia_smi(folder: Path, lines: str) -> Path:
    """An nvidia-smi that records its arguments, prints `lines`, then samples on until stopped."""
    script = folder / "nvidia-smi"
    script.write_text(
        f'#!/bin/sh\necho "$@" > {folder}/args\nprintf "{lines}"\ntouch {folder}/printed\nexec sleep 30\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_fake_nvidia_smi_the_sampler_gives_the_median_and_watches_the_visible_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvidia_smi(tmp_path, "40\\n[N/A]\\n70\\n60\\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    with UtilisationSampler() as sampler:
        wait_for(lambda: (tmp_path / "printed").exists(), 10, "the fake nvidia-smi printed")
    assert sampler.samples == [40.0, 70.0, 60.0] and sampler.median == 60.0
    args = (tmp_path / "args").read_text().split()
    assert args == ["--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100", "-i", "3"]


def test_without_nvidia_smi_the_sampler_records_none_and_does_not_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with UtilisationSampler() as sampler:
        pass
    assert sampler.median is None and sampler.samples == [] and gpu_index() == "0"


def bulk_alone(name: str, rows_per_s: float, sent_rps: float) -> dict[str, object]:
    return {"scenario": name, "classes": [{"class": "bulk", "ok_rows_per_s": rows_per_s, "sent_rps": sent_rps}]}


@pytest.mark.parametrize(
    ("twice_rows", "twice_sent", "saturated", "says"),
    [
        (10_500.0, 8000.0, True, "bulk saturates: yes (within 10%): 10000 rows/s at the rate, 10500 at twice it (+5%"),
        (13_000.0, 8000.0, False, "bulk saturates: NO (within 10%): 10000 rows/s at the rate, 13000 at twice it (+30%"),
        (10_000.0, 4400.0, None, "bulk saturates: UNKNOWN: the generator sent only +10% more at twice the rate"),
    ],
)
def test_bulk_saturates_when_twice_the_rate_adds_at_most_ten_percent_of_rows(
    twice_rows: float, twice_sent: float, saturated: bool | None, says: str
) -> None:
    results = [bulk_alone("bulk alone", 10_000.0, 4000.0), bulk_alone("bulk alone at 2x rate", twice_rows, twice_sent)]
    check = gpu_table.saturation(results)
    assert check["saturated"] is saturated and check["verdict"].startswith(says), check["verdict"]
    assert gpu_table.saturation(results[:1]) is None  # --scenarios left one out: no verdict


def test_the_table_gives_each_scenarios_median_utilisation() -> None:
    row = {
        "class": "bulk",
        "offered_rps": 4000.0,
        "sent_rps": 3990.0,
        "ok": 100,
        "overloaded": 0,
        "goodput_rps": 20.0,
        "ok_rows_per_s": 320.0,
        "latency_us": {"p50": 1000.0, "p99": 2000.0, "p999": 3000.0},
        "compute_p50_us": 4_000,
    }
    repetitions = [
        [{"scenario": "bulk alone", "classes": [row], "gpu_util_pct": util}, {"scenario": "x", "classes": [row]}]
        for util in (90.0, 96.0, None)
    ]
    table = gpu_table.medians(repetitions)
    assert [r["gpu_util_pct"] for r in table] == [93.0, None]
    text = gpu_table.format_table("GPU", 3, table, {"p50": 1.0, "p99": 2.0, "p999": 3.0})
    assert text.splitlines()[1].endswith("| p99.9 ms | GPU util % |") and "preempted" not in text
    assert "| bulk alone | bulk | 4000 | 3990 | 100 | 0 | 20.0 | 320 | 1.000 | 2.000 | 3.000 | 93 |" in text
    assert "| x | bulk |" in text and text.splitlines()[-2].endswith("| 3.000 | - |")
    assert all(line.count("|") == 13 for line in text.splitlines()[1:]), text  # 12 columns, floor row too


def test_scenario_numbers_pick_scenarios_from_one() -> None:
    assert gpu_scenarios.scenario_numbers("1,8,9") == [1, 8, 9]
    with pytest.raises(Exception, match="scenario numbers from 1 to 9"):
        gpu_scenarios.scenario_numbers("0,10")


def bulk_row(**figures: object) -> dict[str, object]:
    return {
        "class": "bulk",
        "offered_rps": 100.0,
        "sent_rps": 100.0,
        "ok": 100,
        "overloaded": 0,
        "goodput_rps": 100.0,
        "ok_rows_per_s": 1600.0,
        "latency_us": {"p50": 1000.0, "p99": 2000.0, "p999": 3000.0},
    } | figures


@pytest.mark.parametrize(
    ("util", "busy", "says"),
    [
        (97.0, True, "bulk keeps the GPU busy: yes: median utilisation 97% alone (>= 90%)"),
        (40.0, False, "bulk keeps the GPU busy: NO: median utilisation 40% alone (>= 90%)"),
        (None, None, "bulk keeps the GPU busy: UNKNOWN: no utilisation sample (nvidia-smi)"),
    ],
)
def test_bulk_keeps_the_gpu_busy_is_read_from_bulk_alones_utilisation(
    util: float | None, busy: bool | None, says: str
) -> None:
    """The premise of every isolation verdict: a GPU with idle time beside realtime says nothing of contention."""
    table = gpu_table.medians([[{"scenario": "bulk alone", "classes": [bulk_row()], "gpu_util_pct": util}]])
    check = gpu_table.busy(table)
    assert check["busy"] is busy and check["verdict"] == says
    assert gpu_table.busy(gpu_table.medians([[{"scenario": "x", "classes": [bulk_row()]}]])) is None


def test_a_run_with_a_model_on_the_cpu_or_unknown_is_not_a_gpu_figure() -> None:
    runs = [
        {"scenario": "a", "classes": [bulk_row()], "cpu_nodes": {"mlp-light": False, "bulk-heavy": False}},
        {"scenario": "b", "classes": [bulk_row()], "cpu_nodes": {"mlp-light": False, "bulk-heavy": True}},
        {"scenario": "c", "classes": [bulk_row()], "cpu_nodes": {"mlp-light": None}},
    ]
    assert gpu_table.gpu_figures(gpu_table.medians([runs[:1]]))["gpu"] is True
    assert gpu_table.gpu_figures([])["gpu"] is None  # no run finished: nothing to call a GPU figure
    verdict = gpu_table.gpu_figures(gpu_table.medians([runs]))
    assert verdict == {
        "gpu": False,
        "verdict": "NOT a GPU figure: bulk-heavy, mlp-light: nodes on the CPU, or unknown (cpu_nodes)",
    }


def test_the_medians_take_a_repetition_cut_short_and_figures_missing_without_failing() -> None:
    """A call killed mid-repetition, or a run with no OK reply, still gives a table."""
    full = [{"scenario": "a", "classes": [bulk_row()]}, {"scenario": "b", "classes": [bulk_row()]}]
    short = [{"scenario": "a", "classes": [bulk_row(latency_us={})]}]
    table = gpu_table.medians([full, short])
    assert [r["scenario"] for r in table] == ["a", "b"]
    assert table[0]["classes"][0]["latency_us"] == {"p50": 1000.0, "p99": 2000.0, "p999": 3000.0}
    assert "| b | bulk |" in gpu_table.format_table("GPU", 2, table, None)


def test_bulk_senders_are_summed_and_their_latency_is_the_worst_senders() -> None:
    one = bulk_row(model="m", sent=10, deadline_exceeded=0, other=0, lost=0, duplicated=0)
    two = bulk_row(
        model="m",
        sent=30,
        ok=20,
        deadline_exceeded=1,
        other=0,
        lost=0,
        duplicated=1,
        latency_us={"p50": 5.0, "p99": 1.0, "p999": 9e3},
    )
    merged = gpu_scenarios.merged([one, two])
    assert (merged["senders"], merged["sent"], merged["ok"], merged["offered_rps"]) == (2, 40, 120, 200.0)
    assert merged["duplicated"] == 1
    assert merged["latency_us"] == {"p50": 1000.0, "p99": 2000.0, "p999": 9000.0}


def test_the_bulk_model_shares_one_weight_over_its_layers_and_runs_on_the_cpu(tmp_path: Path) -> None:
    """build_scripts/make_bulk_model.py, small: a model repository entry that the CPU provider runs."""
    import sys

    import numpy as np
    import onnx
    import onnxruntime as ort

    sys.path.insert(0, str(ROOT / "build_scripts"))
    try:
        from make_bulk_model import gflop_per_image, write_bulk_model
    finally:
        sys.path.remove(str(ROOT / "build_scripts"))
    folder = write_bulk_model(tmp_path, channels=8, depth=3)
    (model,) = discover(tmp_path, "onnxruntime")
    assert model.name == "bulk-heavy" and folder == tmp_path / "bulk-heavy"
    graph = onnx.load(str(folder / "model.onnx")).graph
    assert [n.input[1] for n in graph.node if n.op_type == "Conv"] == ["stem_k", "k", "k", "k"]
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"image": np.ones((2, 3, 64, 64), np.float32)})
    assert logits.shape == (2, 10) and np.isfinite(logits).all()
    assert round(gflop_per_image(256, 8), 1) == 38.7  # the GPU's: ~170 times cnn-heavy's ~0.23
