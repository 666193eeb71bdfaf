"""bench/gpu_checks.py without a GPU: its command line, its refusal here, and the parts
of its checks that are plain arithmetic (edged.loadgen.gpu_memory_check: the filler's
chunks, the configs, the table).
None of this shows that a check passes on a GPU; bench/gpu_verify.sh is where it runs."""

from __future__ import annotations

import importlib
import json
import signal
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from support import REPO_ROOT, wait_for
from support.gpu import MLP, fake_cuda_layer, fake_ort

from edged.backends import onnxruntime_cuda
from edged.backends.cuda import cuda_available
from edged.config import ClassConfig, parse_config
from edged.loadgen import gpu_memory_check

ROOT = REPO_ROOT
CHECKS = ROOT / "bench" / "gpu_checks.py"
MIB = 1024 * 1024
NO_CUDA = cuda_available()


def checks(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECKS), *args], capture_output=True, text=True, timeout=120)


def test_gpu_checks_help_names_both_checks_and_what_they_prove() -> None:
    done = checks("--help")
    assert done.returncode == 0, done.stderr
    assert "{preflight,stream,memory,green,weights,ipc,edges}" in done.stdout and "--out" in done.stdout
    assert "Cannot use user supplied initializer" in " ".join(done.stdout.split())
    assert "cuStreamWaitValue32" in done.stdout and "64 MiB" in done.stdout


@pytest.mark.skipif(NO_CUDA is None, reason="this machine has a CUDA device")
@pytest.mark.parametrize("check", ["stream", "memory", "green", "weights", "ipc", "edges"])
def test_gpu_checks_without_a_gpu_stops_with_one_sentence_and_the_reason_in_its_json(
    check: str, tmp_path: Path
) -> None:
    done = checks(check, "--out", str(tmp_path))
    assert done.returncode == 1
    reason = f"gpu_checks.py {check} needs a CUDA GPU, and this machine has none usable: {NO_CUDA}"
    assert reason in done.stderr and "Traceback" not in done.stderr
    assert json.loads((tmp_path / f"gpu-checks-{check}.json").read_text()) == {"outcome": "FAIL", "error": reason}


def test_gpu_checks_a_check_that_raises_keeps_what_it_wrote_and_adds_its_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One failure never loses another result: the runs a check saved stay in its JSON."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    gpu_checks = importlib.import_module("gpu_checks")
    monkeypatch.setattr(gpu_checks, "needs_gpu", lambda check: None)

    def run(out: Path) -> int:
        gpu_checks.write(out, "edges", {"runs": [{"ok": True}]})
        raise RuntimeError("the second run broke")

    monkeypatch.setitem(sys.modules, "gpu_check_edges", SimpleNamespace(run=run))
    assert gpu_checks.main(["edges", "--out", str(tmp_path)]) == 1
    record = json.loads((tmp_path / "gpu-checks-edges.json").read_text())
    assert record == {"runs": [{"ok": True}], "outcome": "FAIL", "error": "RuntimeError: the second run broke"}


def test_gpu_checks_a_check_ended_by_its_steps_time_limit_writes_what_it_had_and_why(tmp_path: Path) -> None:
    """bench/gpu_verify.sh's `timeout` sends SIGTERM: the JSON must not be lost with the process."""
    script = f"""
import sys, time, types
sys.path.insert(0, {str(ROOT / "bench")!r})
import gpu_checks
gpu_checks.needs_gpu = lambda check: None
def run(out):
    gpu_checks.write(out, "edges", {{"runs": [{{"ok": True}}]}})
    time.sleep(60)
sys.modules["gpu_check_edges"] = types.SimpleNamespace(run=run)
sys.exit(gpu_checks.main(["edges", "--out", {str(tmp_path)!r}]))
"""
    check = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    path = tmp_path / "gpu-checks-edges.json"
    wait_for(path.exists, 60, "the check's first save")
    check.send_signal(signal.SIGTERM)
    _, stderr = check.communicate(timeout=30)
    assert check.returncode == 1, stderr
    record = json.loads(path.read_text())
    assert record["runs"] == [{"ok": True}] and record["outcome"] == "FAIL"
    assert record["error"] == "Ended: ended by its step's time limit (SIGTERM)"


@pytest.mark.parametrize(
    "error",
    [
        "cudaIpcOpenMemHandle failed: cudaErrorMapBufferObjectFailed: mapping of buffer object failed",
        "cuGreenCtxCreate failed: CUDA_ERROR_NOT_SUPPORTED: operation not supported",
        "cuStreamWaitValue32 failed: CUDA_ERROR_NOT_SUPPORTED: operation not supported",
        "the daemon cannot open this CUDA IPC handle: cudaIpcOpenMemHandle failed: cudaErrorInvalidValue: x",
    ],
)
def test_gpu_checks_a_feature_the_machine_lacks_is_unsupported_with_cudas_error_not_a_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: str
) -> None:
    """As under gVisor, where CUDA IPC, green contexts and stream waits are unproven."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    gpu_checks = importlib.import_module("gpu_checks")
    monkeypatch.setattr(gpu_checks, "needs_gpu", lambda check: None)

    def run(out: Path) -> int:
        raise RuntimeError(error)

    monkeypatch.setitem(sys.modules, "gpu_check_ipc", SimpleNamespace(run=run))
    assert gpu_checks.main(["ipc", "--out", str(tmp_path)]) == gpu_checks.UNSUPPORTED
    record = json.loads((tmp_path / "gpu-checks-ipc.json").read_text())
    assert record == {"outcome": "UNSUPPORTED", "error": f"RuntimeError: {error}"}


class FakeCard:
    """A device of `free` bytes whose allocations are rounded up to 2 MiB pages, as
    cudaMalloc's are, and that refuses any chunk above `largest_hole` (fragmentation)."""

    def __init__(self, free: int, largest_hole: int = 1 << 62) -> None:
        self.free, self.largest_hole, self.asked = free, largest_hole, []

    def alloc(self, size: int) -> int | None:
        self.asked.append(size)
        taken = -(-size // (2 * MIB)) * 2 * MIB
        if size > self.largest_hole or taken > self.free:
            return None
        self.free -= taken
        return len(self.asked)


def test_fake_card_the_filler_leaves_the_asked_memory_and_no_more_than_a_page_beside() -> None:
    card = FakeCard(free=10_000 * MIB + 300 * 1024)
    chunks = gpu_memory_check.fill(card.alloc, lambda: card.free, 64 * MIB)
    assert 64 * MIB <= card.free < 66 * MIB
    sizes = [size for _, size in chunks]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == 256 * MIB and sizes[-1] >= MIB
    assert len({handle for handle, _ in chunks}) == len(chunks)


def test_fake_card_a_chunk_that_fails_halves_the_size_and_filling_goes_on() -> None:
    card = FakeCard(free=2_000 * MIB, largest_hole=100 * MIB)
    chunks = gpu_memory_check.fill(card.alloc, lambda: card.free, 64 * MIB)
    assert {size for _, size in chunks} <= {64 * MIB, 32 * MIB, 16 * MIB, 8 * MIB, 4 * MIB, 2 * MIB, MIB}
    assert 64 * MIB <= card.free < 66 * MIB
    assert card.asked[:2] == [256 * MIB, 128 * MIB]  # both refused, then 64 MiB chunks


def test_fake_card_a_card_already_below_the_floor_is_left_alone() -> None:
    card = FakeCard(free=50 * MIB)
    assert gpu_memory_check.fill(card.alloc, lambda: card.free, 64 * MIB) == [] and card.asked == []


def test_fake_card_allocations_that_free_nothing_stop_at_the_free_memory_seen_first() -> None:
    chunks = gpu_memory_check.fill(lambda size: object(), lambda: 1024 * MIB, 64 * MIB)
    assert sum(size for _, size in chunks) == 1024 * MIB


def test_the_memory_check_configs_parse_with_the_built_in_classes() -> None:
    configs = gpu_memory_check.memory_configs()
    assert list(configs) == ["default classes", "realtime cuda_graph"]
    parsed = {name: parse_config(tomllib.loads(text), base_dir=ROOT) for name, text in configs.items()}
    for config in parsed.values():
        assert config.backend == "onnxruntime-cuda" and config.model_repository == ROOT / "engines"
        assert [(c.name, c.max_batch) for c in config.classes] == [("realtime", 4), ("standard", 8), ("bulk", 16)]
    assert not any(c.cuda_graph for c in parsed["default classes"].classes)
    graphs = {c.name: c.cuda_graph for c in parsed["realtime cuda_graph"].classes}
    assert graphs == {"realtime": True, "standard": False, "bulk": False}
    # Named, the classes keep their built-in settings: bulk still yields, its calls capped.
    bulk = parsed["realtime cuda_graph"].class_named("bulk")
    assert bulk.yields and bulk.max_call_ms > 0 and bulk.batch_wait_us == 500


def test_the_memory_table_gives_planned_and_measured_mib_per_lane() -> None:
    table = gpu_memory_check.format_memory_table(
        [
            {
                "config": "default classes",
                "lane": "realtime",
                "planned_bytes": 3 * MIB,
                "measured_bytes": 5 * MIB // 2,
                "context_bytes": 300 * MIB,
            },
            {"config": "default classes", "lane": "bulk", "planned_bytes": 0, "measured_bytes": None},
        ]
    )
    assert table.splitlines() == [
        "| config | lane | planned MiB | measured MiB | context MiB |",
        "|---|---|---|---|---|",
        "| default classes | realtime | 3.0 | 2.5 | 300.0 |",
        "| default classes | bulk | 0.0 | - | - |",
    ]


def weights_replies(lane_mib: dict[str, float], weights_mib: float, copies: int = 1) -> tuple[dict, list]:
    """The stats and models replies of a daemon serving one 192 MiB model on its three lanes
    (realtime with its inline path: two sessions), each lane having taken `lane_mib`."""
    file_bytes = 192 * MIB
    weights = {"copies": copies, "new_copies": copies, "file_bytes": file_bytes, "planned_bytes": copies * file_bytes}
    weights |= {"added_bytes": int(weights_mib * MIB), "draining_copies": 0}
    stats = {"memory": {"rss_bytes": 0, "weights": {"matmuls": weights}}}
    sessions = {"realtime": 2, "standard": 1, "bulk": 1}
    plans = {
        lane: {"sessions": sessions[lane], "planned_bytes": 4 * MIB, "lane_measured_bytes": int(taken * MIB)}
        for lane, taken in lane_mib.items()
    }
    return stats, [{"name": "matmuls", "gpu_memory": plans}]


def test_the_weights_check_passes_a_model_held_once_and_lanes_holding_only_their_own_memory() -> None:
    stats, models = weights_replies({"realtime": 150, "standard": 60, "bulk": 60}, weights_mib=194)
    rows = gpu_memory_check.weights_rows("default classes", stats, models)
    assert gpu_memory_check.weights_once(rows) == []
    assert gpu_memory_check.format_weights_table(rows).splitlines()[2:] == [
        "| default classes | matmuls | (weights, once) | - | 192.0 | 192.0 | 194.0 |",
        "| default classes | matmuls | realtime | 2 | 192.0 | 4.0 | 150.0 |",
        "| default classes | matmuls | standard | 1 | 192.0 | 4.0 | 60.0 |",
        "| default classes | matmuls | bulk | 1 | 192.0 | 4.0 | 60.0 |",
    ]


def test_the_weights_check_fails_a_lane_whose_sessions_copied_the_weights_naming_it() -> None:
    """As ONNX Runtime would if it refused the shared device values: a copy per session."""
    stats, models = weights_replies({"realtime": 2 * 200, "standard": 60, "bulk": 200}, weights_mib=194)
    failures = gpu_memory_check.weights_once(gpu_memory_check.weights_rows("c", stats, models))
    assert [f.split(" took")[0] for f in failures] == ["lane realtime", "lane bulk"]
    assert "as if they held copies of their own" in failures[0]


def test_the_weights_check_fails_a_model_whose_weights_took_no_copy_or_two() -> None:
    for taken in (0, 2 * 192):
        stats, models = weights_replies({"bulk": 10}, weights_mib=taken)
        (failure,) = gpu_memory_check.weights_once(gpu_memory_check.weights_rows("c", stats, models))
        assert failure.startswith(f"model matmuls: its weights took {taken:.1f} MiB"), failure


def test_fake_ort_the_stream_check_loads_captures_and_runs_the_held_call_on_one_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ONNX Runtime keeps CUDA graphs per thread: the held run must replay the graphs
    captured at load, as a lane's worker does, so all of it happens on one thread."""
    log: list[str] = []
    fake_cuda_layer(monkeypatch, log)
    ort = fake_ort(monkeypatch, log)
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    stream_check = importlib.import_module("gpu_check_stream")
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    klass = ClassConfig("realtime", order=0, max_batch=4, cuda_graph=True)
    backend.reserve([MLP], [klass], backend.free_bytes())
    flag = SimpleNamespace(device=0, set=lambda value: log.append("flag.set"), close=lambda: None)
    cpu = SimpleNamespace(run=lambda model, inputs: [np.zeros((4, 10), np.float32)])
    result = stream_check.held_run(lambda: backend.load(MLP, klass), MLP, cpu, flag=lambda: flag)
    assert "error" not in result, result
    assert ort.captured == {"1", "2", "3", "4"}
    assert len(ort.threads) == 1 and threading.get_ident() not in ort.threads
    last_run = len(log) - 1 - log[::-1].index("ort.run")
    assert log.index("stream.wait") < last_run and "stream.close" in log


def test_the_green_check_passes_a_runner_equal_to_the_cpu_and_fails_one_that_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The comparison the green check makes, with ONNX Runtime's CPU runner standing in for
    the green context's (which cannot exist here): cnn-heavy, through cuDNN on a GPU."""
    from edged.backends.onnxruntime_cpu import OnnxRuntimeCpu
    from edged.models.repository import discover

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    green = importlib.import_module("gpu_check_green")
    cpu = importlib.import_module("gpu_checks").CpuReference()
    model = next(m for m in discover(ROOT / "engines", "onnxruntime") if m.name == "cnn-heavy")
    runner = OnnxRuntimeCpu().load(model, ClassConfig("bulk", order=2, max_batch=16))
    assert [r["ok"] for r in green.compare(runner, model, cpu)] == [True, True, True]

    class Off:
        def run(self, inputs: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
            return [out * 1.5 for out in runner.run(inputs, names)]  # far past the TF32 bound

    assert [r["ok"] for r in green.compare(Off(), model, cpu)] == [False, False, False]
    runner.close()
