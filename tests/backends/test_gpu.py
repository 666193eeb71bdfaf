"""The ONNX Runtime CUDA backend.

Pure and CPU tiers (run everywhere): the reservation arithmetic and its refusal,
the `cuda_graph` key, the `stats`/`models` fields and the start-up refusal (through a
daemon on a fake reserving backend, tests/support/fake_gpu.py), and that selecting the
backend where there is no GPU stops `edged serve` with one clear sentence. GPU tier (marked
`gpu`, skipped with the reason where CUDA cannot be used): the session really runs
on CUDA, agrees with the CPU, each lane has its own stream at its priority, and the
memory limit is what the config asked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from support import ENGINES, Reference, RunningDaemon, random_input, run_edged, short_dir, wait_for

from edged.backends.cuda import clamp_priority, cuda_available
from edged.backends.gpu_memory import (
    MIB,
    ReservationError,
    check_fits,
    check_measured,
    io_bytes,
    lane_reservation,
    reserve_lanes,
)
from edged.backends.shared import Weights
from edged.backends.tf32 import tf32_atol
from edged.client import Client, InvalidArgument
from edged.config import ClassConfig, ConfigError, parse_config
from edged.models.repository import ModelEntry, Variant, discover
from edged.wire.codec import TensorSpec
from edged.wire.signature import Signature

SUPPORT = Path(__file__).resolve().parents[1] / "support"
NO_CUDA = cuda_available()
MODELS = discover(ENGINES, "onnxruntime")
WEIGHTS = {m.name: m.variant.path.stat().st_size for m in MODELS}


def mlp() -> ModelEntry:
    return next(m for m in MODELS if m.name == "mlp-light")


# --- pure: the reservation arithmetic ---------------------------------------------


def test_io_bytes_are_every_input_and_output_at_the_largest_batch() -> None:
    # mlp-light: x[N, 64] -> scores[N, 10], float32.
    assert io_bytes(mlp(), 4) == 4 * (64 + 10) * 4


def test_a_lane_plans_buffers_and_its_arena_cap_per_worker_and_no_weights() -> None:
    klass = ClassConfig("rt", order=0, workers=2, max_batch=4, arena_cap_mb=64, stream_priority=-1, inline_max_us=0)
    lane = lane_reservation(klass, MODELS)
    sessions = 2 * len(MODELS)
    arena = 64 * MIB // sessions  # the lane's cap, split between its sessions
    expected_device = sum(2 * (io_bytes(m, 4) + arena) for m in MODELS)
    assert lane.device_bytes == expected_device
    assert lane.pinned_bytes == sum(2 * io_bytes(m, 4) for m in MODELS)
    assert lane.arena_capped and lane.stream_priority == -1
    assert all(m.arena_limit_bytes == arena for m in lane.models)
    assert "lane rt: stream priority -1" in lane.describe()


def test_a_class_with_an_inline_path_reserves_its_sessions_too() -> None:
    for inline in (300, None):  # set, or left to the daemon on a class that does not wait to fill batches
        klass = ClassConfig("rt", order=0, workers=2, max_batch=4, inline_max_us=inline)
        assert all(m.sessions == 3 for m in lane_reservation(klass, MODELS).models)


def test_no_arena_cap_plans_the_buffers_alone_and_says_the_arena_is_uncapped() -> None:
    lane = lane_reservation(ClassConfig("bulk", order=0, max_batch=16, batch_wait_us=500), MODELS)
    assert not lane.arena_capped
    assert all(m.arena_limit_bytes == 0 for m in lane.models)
    assert lane.device_bytes == sum(io_bytes(m, 16) for m in MODELS)
    assert "uncapped" in lane.describe()


def test_lanes_that_leave_less_than_the_headroom_after_warm_up_are_refused_naming_each_lane() -> None:
    lanes = [
        replace(lane_reservation(ClassConfig("realtime", order=0), MODELS), measured_bytes=300 * MIB),
        replace(lane_reservation(ClassConfig("bulk", order=1), MODELS), measured_bytes=500 * MIB),
    ]
    check_measured(lanes, 1106 * MIB, 256 * MIB, "Test GPU", 50 * MIB)  # exactly the headroom left
    with pytest.raises(ReservationError) as refusal:
        check_measured(lanes, 1106 * MIB - 1, 256 * MIB, "Test GPU", 50 * MIB)
    message = str(refusal.value)
    assert "took 850.0 MiB of GPU memory (lane realtime 300.0 MiB, bulk 500.0 MiB, the weights 50.0 MiB)" in message
    assert "less than server.gpu_headroom_mb = 256" in message and "lower server.gpu_headroom_mb" in message


def test_a_dynamic_dimension_besides_the_batch_is_refused_with_the_reason() -> None:
    spec = TensorSpec("tokens", "float32", (-1, -1))
    model = ModelEntry("seq", "", Signature((spec,), (spec,)), Variant("fp32", "onnxruntime", Path("x.onnx")))
    with pytest.raises(ReservationError, match=r"model seq: tokens has shape \[-1, -1\].*preallocates every buffer"):
        io_bytes(model, 4)


def test_lanes_that_exceed_the_free_memory_are_refused_naming_each_lane() -> None:
    lanes = [
        lane_reservation(ClassConfig("realtime", order=0, arena_cap_mb=512), MODELS),
        lane_reservation(ClassConfig("bulk", order=1, arena_cap_mb=1024), MODELS),
    ]
    total = sum(lane.device_bytes for lane in lanes)
    check_fits(lanes, total, "Test GPU")  # exactly fits
    with pytest.raises(ReservationError) as refusal:
        check_fits(lanes, total - 1, "Test GPU")
    message = str(refusal.value)
    assert "Test GPU has" in message and "realtime" in message and "bulk" in message
    assert "lower classes.*.arena_cap_mb, max_batch or workers" in message
    assert "would take" in message


def test_the_plan_counts_each_models_new_weights_once_beside_its_lanes_naming_each() -> None:
    """Weights are the model's, not the lane's: three lanes of a model plan its file once,
    and a model whose copy the serving lanes hold (a reload that changed nothing) none."""
    lanes = [
        lane_reservation(ClassConfig(name, order=i, arena_cap_mb=64, inline_max_us=0), MODELS)
        for i, name in enumerate("abc")
    ]
    weights = [Weights("mlp-light", 1, 1, WEIGHTS["mlp-light"]), Weights("cnn-heavy", 1, 0, WEIGHTS["cnn-heavy"])]
    total = sum(lane.device_bytes for lane in lanes) + WEIGHTS["mlp-light"]
    check_fits(lanes, total, "Test GPU", weights)  # exactly fits
    with pytest.raises(ReservationError) as refusal:
        check_fits(lanes, total - 1, "Test GPU", weights)
    message = str(refusal.value)
    assert "(lane a 64.0 MiB, b 64.0 MiB, c 64.0 MiB, model mlp-light's weights 0.3 MiB)" in message, message
    assert "cnn-heavy" not in message


def test_a_priority_outside_the_device_range_is_clamped() -> None:
    assert clamp_priority(-10, -5, 0) == -5
    assert clamp_priority(3, -5, 0) == 0
    assert clamp_priority(-2, -5, 0) == -2


# --- the accuracy bound on a GPU: TF32 (edged.backends.tf32 says how it is derived) ----
# (The former fixed rtol = atol = 2e-3 fails the emulation below once mlp-light's
# outputs reach ~100; its largest error there is ~6% of this bound.)


def as_tf32(array: np.ndarray) -> np.ndarray:
    """float32 rounded to TF32's 10 mantissa bits (to nearest, ties away from zero)."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def test_the_tf32_bound_holds_for_mlp_light_computed_in_emulated_tf32(reference: Reference) -> None:
    """On the CPU: mlp-light's layers with every operand rounded as TF32 rounds it stay within
    the bound of ONNX Runtime's float32, and the bound is not vacuous (under 2% of the scale)."""
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(mlp().variant.path).graph.initializer}
    for seed, scale in ((1, 1.0), (2, 30.0)):
        inputs = {"x": random_input("mlp-light", 64, seed)["x"] * np.float32(scale)}
        activations = inputs["x"]
        for layer in range(3):
            product = as_tf32(activations) @ as_tf32(weights[f"w{layer}"]) + weights[f"b{layer}"]
            activations = np.maximum(product, 0) if layer < 2 else product
        expected = reference.run("mlp-light", inputs)
        bound = tf32_atol(mlp(), expected)
        assert np.abs(activations - expected).max() <= bound < 0.02 * np.abs(expected).max()


# --- config -------------------------------------------------------------------------


def test_cuda_graph_is_off_by_default_and_takes_a_boolean() -> None:
    config = parse_config({}, base_dir=Path("/srv"))
    assert not any(c.cuda_graph for c in config.classes)
    one_class = '[server]\ndefault_class = "realtime"\n[classes.realtime]\ncuda_graph = '
    config = parse_config(tomllib.loads(one_class + "true\n"), base_dir=Path("/srv"))
    assert config.class_named("realtime").cuda_graph
    with pytest.raises(ConfigError, match=r"classes\.realtime\.cuda_graph = 'yes' is not valid: set it to true or"):
        parse_config(tomllib.loads(one_class + '"yes"\n'), base_dir=Path("/srv"))


# --- replies: what an operator reads ------------------------------------------------


FAKE_SESSION_MB = 3  # what each session the fake GPU loads takes off its free memory
FAKE_CONTEXT_MB = 40  # what its first session takes for good


def serve_on_fake_gpu(free_mb: int, folder: Path, server: str = "") -> subprocess.Popen[bytes]:
    """`edged serve` on the fake GPU backend (tests/support/fake_gpu.py), with `free_mb` free
    and FAKE_SESSION_MB taken by each session; `server` adds lines to [server]."""
    config = folder / "edged.toml"
    config.write_text(f'[server]\nbackend = "fake-gpu"\n{server}')
    log = (folder / "daemon.log").open("wb")
    command = [sys.executable, str(SUPPORT / "fake_gpu.py"), "serve", "--config", str(config)]
    return subprocess.Popen(
        [*command, "--endpoint", f"ipc://{folder}/d.sock"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={
            **os.environ,
            "EDGED_FAKE_GPU_FREE_MB": str(free_mb),
            "EDGED_FAKE_GPU_SESSION_MB": str(FAKE_SESSION_MB),
            "EDGED_FAKE_GPU_CONTEXT_MB": str(FAKE_CONTEXT_MB),
        },
    )


def test_fake_gpu_daemon_reports_each_lane_plan_and_measured_memory_in_stats_and_models() -> None:
    """Through the daemon's real start-up, with a fake reserving backend: the figures an
    operator reads are the plans worked out before any lane loaded, and what each lane's
    loading took off the device's free memory (here FAKE_SESSION_MB per session)."""
    folder = short_dir()
    daemon = serve_on_fake_gpu(64 * 1024, folder)
    try:
        endpoint = f"ipc://{folder}/d.sock"
        with Client(endpoint, timeout_ms=60_000) as client:
            wait_for(lambda: daemon.poll() is None and client.health()["state"] == "serving", 60, "serving")
            stats, models = client.stats(), client.models()
            # Its buffers hold max_batch rows: 5 rows on realtime (max_batch 4) are refused at admission.
            with pytest.raises(InvalidArgument, match=r"5 rows exceed classes\.realtime\.max_batch = 4"):
                client.infer("mlp-light", random_input("mlp-light", 5, seed=1), klass="realtime")
            assert client.infer("mlp-light", random_input("mlp-light", 4, seed=1), klass="realtime")["scores"].shape
    finally:
        daemon.terminate()
        assert daemon.wait(30) == 0
    config = parse_config({}, base_dir=Path("/srv"))
    expected = reserve_lanes(MODELS, config.classes, 1 << 40, "any")
    memory = next(m for m in models if m["name"] == "mlp-light")["gpu_memory"]
    for klass in config.classes:
        gpu = stats["classes"][klass.name]["gpu"]
        assert gpu["stream_priority"] == klass.stream_priority
        assert gpu["planned_bytes"] == expected[klass.name].device_bytes > 0
        assert gpu["pinned_bytes"] == expected[klass.name].pinned_bytes
        sessions = sum(m.sessions for m in expected[klass.name].models)
        # The first lane's figure holds its sessions alone: the context's share is reported apart.
        assert gpu["measured_bytes"] == sessions * FAKE_SESSION_MB * MIB > 0, klass.name
        assert gpu["context_bytes"] == FAKE_CONTEXT_MB * MIB, klass.name
        assert memory[klass.name]["lane_measured_bytes"] == gpu["measured_bytes"]
    assert memory["bulk"]["io_bytes_per_worker"] == io_bytes(mlp(), 16)
    log = (folder / "daemon.log").read_text()
    assert "lane realtime: stream priority -1, planned" in log
    assert f"the GPU context's one-time share: {FAKE_CONTEXT_MB:.1f} MiB, counted in no lane" in log
    # realtime: a session per model for its worker and one for its inline path
    assert f"measured {2 * len(MODELS) * FAKE_SESSION_MB:.1f} MiB" in log


def test_fake_gpu_daemon_whose_lanes_leave_less_than_the_headroom_refuses_to_start_naming_each() -> None:
    """The plans fit (sessions' arenas uncapped: the plan counts the small demo weights),
    but what loading took leaves less than server.gpu_headroom_mb of the free memory."""
    folder = short_dir()
    daemon = serve_on_fake_gpu(1024, folder, server="gpu_headroom_mb = 1020\n")
    try:
        assert daemon.wait(60) == 1
    finally:
        daemon.kill()
    log = (folder / "daemon.log").read_text()
    assert "start-up failed: loaded and warmed, the lanes took" in log, log
    assert "less than server.gpu_headroom_mb = 1020" in log
    assert all(name in log for name in ("realtime", "standard", "bulk")), log


def test_fake_gpu_daemon_too_small_for_its_lanes_refuses_to_start_naming_each() -> None:
    folder = short_dir()
    daemon = serve_on_fake_gpu(FAKE_CONTEXT_MB, folder)  # none left once the context has its share
    try:
        assert daemon.wait(60) == 1
    finally:
        daemon.kill()
    log = (folder / "daemon.log").read_text()
    assert "start-up failed: the lanes would take" in log and "Fake GPU has 0.0 MiB free" in log
    assert all(name in log for name in ("realtime", "standard", "bulk")), log


def test_a_backend_that_reserves_nothing_adds_no_gpu_fields(daemon: RunningDaemon) -> None:
    with Client(daemon.ipc) as client:
        stats, models = client.stats(), client.models()
    assert all("gpu" not in figures for figures in stats["classes"].values())
    assert all("gpu_memory" not in model for model in models)


def test_the_cpu_backend_serves_more_rows_than_max_batch(daemon: RunningDaemon, reference: Reference) -> None:
    """ONNX Runtime's CPU runner has no fixed buffers: 5 rows on realtime (max_batch 4) run, in one call."""
    inputs = random_input("mlp-light", 5, seed=2)
    with Client(daemon.ipc, timeout_ms=30_000) as client:
        got = client.infer("mlp-light", inputs, klass="realtime", deadline_ms=10_000)["scores"]
    np.testing.assert_allclose(got, reference.run("mlp-light", inputs), rtol=1e-5, atol=1e-5)


# --- without a GPU: a clear refusal ---------------------------------------------------


@pytest.mark.skipif(NO_CUDA is None, reason="this machine has a CUDA device")
def test_cuda_available_gives_the_reason_here() -> None:
    assert isinstance(NO_CUDA, str) and ("cuda-python" in NO_CUDA or "CUDA device" in NO_CUDA)


@pytest.mark.skipif(NO_CUDA is None, reason="this machine has a CUDA device")
def test_serving_on_onnxruntime_cuda_without_a_gpu_stops_start_up_with_the_reason() -> None:
    folder = short_dir()
    config = folder / "edged.toml"
    config.write_text('[server]\nbackend = "onnxruntime-cuda"\n')
    done = run_edged("serve", "--config", str(config), "--endpoint", f"ipc://{folder}/d.sock")
    assert done.returncode == 1
    assert 'start-up failed: server.backend = "onnxruntime-cuda" cannot run here: ' + NO_CUDA in done.stderr


# --- on a GPU ---------------------------------------------------------------------------

gpu = pytest.mark.gpu


def _cuda_backend():  # type: ignore[no-untyped-def]
    if NO_CUDA is not None:
        pytest.skip(f"no GPU: {NO_CUDA}")
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime has no CUDAExecutionProvider: pip install -e '.[gpu]'")
    from edged.backends.onnxruntime_cuda import OnnxRuntimeCuda

    return OnnxRuntimeCuda()


REALTIME = ClassConfig("realtime", order=0, max_batch=4, stream_priority=-1, arena_cap_mb=256)
BULK = ClassConfig("bulk", order=1, max_batch=16, stream_priority=0, arena_cap_mb=512)


@gpu
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_runs_on_cuda_and_agrees_with_the_cpu(reference: Reference, cuda_graph: bool) -> None:
    backend = _cuda_backend()
    klass = replace(REALTIME, cuda_graph=cuda_graph)
    backend.reserve(MODELS, [klass], backend.free_bytes())
    for model in MODELS:
        runner = backend.load(model, klass)
        try:
            assert runner.providers[0] == "CUDAExecutionProvider"
            for rows in (1, 3, 4):
                inputs = random_input(model.name, rows, seed=rows)
                (got,) = runner.run(inputs, model.signature.output_names)
                expected = reference.run(model.name, inputs)
                np.testing.assert_allclose(got, expected, rtol=0, atol=tf32_atol(model, expected))
        finally:
            runner.close()


@gpu
def test_each_lane_has_its_own_stream_at_its_priority() -> None:
    """Reads back the priority of the stream edged created for each lane: it shows the
    stream is what was asked, not that ONNX Runtime launches every kernel on it (the
    benchmark's realtime latency beside bulk is what shows the priority's effect)."""
    from edged.backends import cuda

    backend = _cuda_backend()
    backend.reserve([mlp()], [REALTIME, BULK], backend.free_bytes())
    most, least = cuda.priority_range()
    runners = [backend.load(mlp(), klass) for klass in (REALTIME, BULK)]
    try:
        assert runners[0].stream.pointer != runners[1].stream.pointer
        for runner, klass in zip(runners, (REALTIME, BULK)):
            assert runner.stream.device_priority() == clamp_priority(klass.stream_priority, most, least)
        assert runners[0].stream.device_priority() < runners[1].stream.device_priority()
    finally:
        for runner in runners:
            runner.close()


@gpu
def test_the_memory_limit_is_what_the_config_asked() -> None:
    backend = _cuda_backend()
    plans = backend.reserve(MODELS, [BULK], backend.free_bytes())
    runner = backend.load(mlp(), BULK)
    try:
        options = runner._session.get_provider_options()["CUDAExecutionProvider"]
        plan = next(m for m in plans["bulk"].models if m.model == "mlp-light")
        # The cap is split between every session of the lane: a worker's and the inline
        # path's, for each model (the first GPU run found this test counting workers only).
        sessions = (BULK.workers + int(BULK.runs_inline)) * len(MODELS)
        assert int(options["gpu_mem_limit"]) == plan.arena_limit_bytes == 512 * MIB // sessions
        assert options["has_user_compute_stream"] == "1"
        held = sum(staged.device.nbytes for staged in runner._staged.values())
        assert held == plan.io_bytes
    finally:
        runner.close()
