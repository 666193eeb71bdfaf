"""The GPU runners' life cycles, on fakes of CUDA, ONNX Runtime's CUDA provider and
TensorRT (tests/support/fake_cuda.py), since none of them can exist here. Each test says
"fake" in its name: it checks the order and the checks of our own code, never that
the real libraries behave as the fakes do.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import wait_for
from support.fake_cuda import PROVIDER, FakeCuda, FakeTrt
from support.gpu import MLP, REALTIME, fake_installed, fake_ort

from edged.backends import (
    BackendError,
    cuda_calls,
    onnxruntime_cuda,
    onnxruntime_cuda_runner,
    onnxruntime_gpu,
    tensorrt_runner,
)
from edged.backends import cuda as cuda_layer
from edged.backends.capture_gate import CaptureGate
from edged.config import ClassConfig


def test_fake_metadata_onnxruntime_and_onnxruntime_gpu_both_installed_stop_start_up_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    fake_ort(monkeypatch, log)
    fake_installed(monkeypatch, "onnxruntime", "onnxruntime-gpu")
    with pytest.raises(BackendError) as refusal:
        onnxruntime_cuda.OnnxRuntimeCuda()
    message = str(refusal.value)
    assert "onnxruntime 1.31.1 and onnxruntime-gpu 1.31.1 are both installed" in message
    assert message.endswith(onnxruntime_cuda.GPU_INSTALL)
    assert "pip uninstall -y onnxruntime onnxruntime-gpu &&" in message


def test_fake_metadata_onnxruntime_gpu_alone_is_accepted(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    fake_ort(monkeypatch, log)
    fake_installed(monkeypatch, "onnxruntime-gpu")
    onnxruntime_cuda.OnnxRuntimeCuda()


def test_fake_metadata_the_two_in_different_folders_are_left_to_the_provider_check(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    """As on a lent GPU machine: the CPU build in the system's site folder, onnxruntime-gpu
    in a folder earlier on PYTHONPATH, which is the one imported."""
    fake_ort(monkeypatch, log)
    fake_installed(monkeypatch, "onnxruntime", "onnxruntime-gpu", folders=("/usr/lib/python3", "/tmp/site"))
    onnxruntime_cuda.OnnxRuntimeCuda()


def test_fake_ort_backend_preloads_the_cuda_libraries_before_its_first_session(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    fake_ort(monkeypatch, log)
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    backend.reserve([MLP], [REALTIME], backend.free_bytes())
    backend.load(MLP, REALTIME).close()
    assert log.index("preload_dlls") < log.index("session.create")
    # cuRAND too: the CUDA provider links it, and fails to load without it.
    assert log.index("load libcurand.so.10") < log.index("session.create")


def test_fake_libraries_one_that_cannot_be_loaded_stops_start_up_naming_it_before_any_session(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    """The first GPU run's likeliest failure: cuDNN not where ONNX Runtime looks."""
    fake_ort(monkeypatch, log)

    def open_library(name: str) -> None:
        if "cudnn" in name:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        log.append(f"load {name}")

    monkeypatch.setattr(onnxruntime_gpu, "open_library", open_library)
    with pytest.raises(BackendError) as refusal:
        onnxruntime_cuda.OnnxRuntimeCuda()
    message = str(refusal.value)
    assert "needs cuDNN (libcudnn.so.9: cannot open shared object file" in message
    assert "cuBLAS" not in message and "LD_LIBRARY_PATH" in message
    assert "load libcublasLt.so.13" in log and "session.create" not in log


def test_fake_libraries_found_in_an_nvidia_folder_on_sys_path_are_loaded_from_there(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda, tmp_path: Path
) -> None:
    """As on a lent machine: onnxruntime-gpu in /tmp/site, cuDNN in the machine's own site folder."""
    fake_ort(monkeypatch, log)
    cudnn = tmp_path / "nvidia" / "cudnn" / "lib"
    cudnn.mkdir(parents=True)
    for name in ("libcudnn.so.9", "libcudnn_graph.so.9", "libcudnn_ops.so.9", "libcudnn_cnn.so.9"):
        (cudnn / name).touch()
    monkeypatch.setattr(onnxruntime_gpu.sys, "path", ["/nowhere", str(tmp_path)])

    def open_library(name: str) -> None:
        if "cudnn" in name and "/" not in name:
            raise OSError(f"{name}: cannot open shared object file")
        log.append(f"load {name}")

    monkeypatch.setattr(onnxruntime_gpu, "open_library", open_library)
    onnxruntime_cuda.OnnxRuntimeCuda()
    assert f"load {cudnn / 'libcudnn.so.9'}" in log and f"load {cudnn / 'libcudnn_cnn.so.9'}" in log


def test_fake_ort_a_provider_that_raises_is_reported_with_its_own_error_not_run_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda, capsys: pytest.CaptureFixture[str]
) -> None:
    ort = fake_ort(monkeypatch, log, provider_error="CUDNN failure 4: CUDNN_STATUS_INTERNAL_ERROR")
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    backend.reserve([MLP], [REALTIME], backend.free_bytes())
    with pytest.raises(BackendError) as refusal:
        backend.load(MLP, REALTIME)
    message = str(refusal.value)
    assert message.endswith("failed to create the session: CUDNN failure 4: CUDNN_STATUS_INTERNAL_ERROR")
    assert "not found" not in message and "EP Error" not in capsys.readouterr().out
    assert [s["enable_fallback"] for s in ort.sessions] == [0]


def test_fake_ort_sessions_take_the_lanes_threads_never_spin_and_refuse_cpu_nodes(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    ort = fake_ort(monkeypatch, log)
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    klass = replace(REALTIME, threads=3)
    backend.reserve([MLP], [klass], backend.free_bytes())
    runner = backend.load(MLP, klass)
    (created,) = ort.sessions
    options = created["options"]
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (3, 1)
    assert options.config["session.intra_op.allow_spinning"] == "0"
    assert options.config["session.inter_op.allow_spinning"] == "0"
    assert options.config["session.disable_cpu_ep_fallback"] == "1"
    assert created["providers"][0][1]["cudnn_conv_algo_search"] == "EXHAUSTIVE"
    assert options.log_severity_level == 3  # errors only, unless EDGED_ORT_LOG_LEVEL says otherwise
    assert not runner.cpu_nodes and backend.describe(MLP) == {"cpu_nodes": False}
    runner.close()


def test_fake_ort_edged_ort_log_level_sets_the_sessions_log_level_and_a_bad_one_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    """The GPU verification sets 1, so that its daemons' logs keep ONNX Runtime's word on
    CUDA graph captures and on copied initializers."""
    ort = fake_ort(monkeypatch, log)
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    backend.reserve([MLP], [REALTIME], backend.free_bytes())
    monkeypatch.setenv("EDGED_ORT_LOG_LEVEL", "1")
    backend.load(MLP, REALTIME).close()
    assert ort.sessions[-1]["options"].log_severity_level == 1
    monkeypatch.setenv("EDGED_ORT_LOG_LEVEL", "info")
    with pytest.raises(BackendError, match=r"EDGED_ORT_LOG_LEVEL='info': ONNX Runtime's log levels are 0 \(verbose\)"):
        backend.load(MLP, REALTIME)


def test_fake_ort_a_model_with_nodes_left_to_the_cpu_loads_with_a_warning_that_says_so(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda, caplog: pytest.LogCaptureFixture
) -> None:
    ort = fake_ort(monkeypatch, log, cpu_nodes=True)
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    backend.reserve([MLP], [REALTIME], backend.free_bytes())
    with caplog.at_level("WARNING", logger="edged"):
        runner = backend.load(MLP, REALTIME)
    assert runner.cpu_nodes
    # The models reply says so: a figure measured on this model is not a GPU figure.
    assert backend.describe(MLP) == {"cpu_nodes": True}
    assert [s["options"].config["session.disable_cpu_ep_fallback"] for s in ort.sessions] == ["1", "0"]
    assert "mlp-light: some of its nodes run on the CPU, not the GPU" in caplog.text
    runner.close()


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_fake_ort_load_runs_every_batch_size_up_to_max_batch(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda, cuda_graph: bool
) -> None:
    """cuDNN's algorithm search and the arena's growth happen at load, at every size a request may bring."""
    ort = fake_ort(monkeypatch, log)
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    klass = replace(REALTIME, max_batch=4, cuda_graph=cuda_graph)
    backend.reserve([MLP], [klass], backend.free_bytes())
    backend.load(MLP, klass).close()
    assert set(ort.rows_run) == {1, 2, 3, 4}


def test_fake_ort_warm_context_runs_one_session_of_the_smallest_model_and_frees_it(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    from support.gpu import MODELS

    ort = fake_ort(monkeypatch, log)
    free = iter([1000, 900])  # before and after: what stays taken is the context's share
    fake_cuda.memory_info = lambda: (next(free), 2000)
    assert onnxruntime_cuda.OnnxRuntimeCuda().warm_context(MODELS) == 100
    assert log.count("session.create") == 1 and log.count("session.freed") == 1 and ort.rows_run == [1]
    assert log[-1] == "stream.close"


def test_fake_ort_session_placed_on_the_cpu_stops_start_up_in_one_sentence(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    fake_ort(monkeypatch, log, placed="CPUExecutionProvider")
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    backend.reserve([MLP], [REALTIME], backend.free_bytes())
    with pytest.raises(BackendError) as refusal:
        backend.load(MLP, REALTIME)
    message = str(refusal.value)
    assert f"put the session on CPUExecutionProvider, not {PROVIDER}" in message
    assert "preload_dlls" in message and message.count(". ") == 0
    assert log[-1] == "stream.close"  # what the runner made is given back


def test_fake_ort_cuda_graphs_are_captured_at_load_for_every_batch_size(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    """The fake provider captures on the run after two regular runs of a graph id, as recent releases do."""
    ort = fake_ort(monkeypatch, log)
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    klass = replace(REALTIME, cuda_graph=True)
    backend.reserve([MLP], [klass], backend.free_bytes())
    backend.load(MLP, klass).close()
    assert ort.captured == {"1", "2"}


def test_fake_ort_no_other_runner_runs_while_one_captures_and_both_go_on(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    """ONNX Runtime captures in global mode, where another thread's CUDA call breaks the
    capture: as on a reload, one lane serves while another lane with cuda_graph loads."""
    fake_ort(monkeypatch, log, capture_s=0.05)
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    graphs = replace(REALTIME, name="graphs", cuda_graph=True)
    backend.reserve([MLP], [REALTIME, graphs], backend.free_bytes())
    serving = backend.load(MLP, REALTIME)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            serving.run(MLP.signature.zeros(1), MLP.signature.output_names)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        wait_for(lambda: log.count("ort.run") >= 10, 10, "the serving lane runs")
        backend.load(MLP, graphs).close()
        served_before_end = log.count("ort.run")
        wait_for(lambda: log.count("ort.run") > served_before_end, 10, "the serving lane runs after the captures")
    finally:
        stop.set()
        thread.join()
        serving.close()
    during, capturing = [], False
    for entry in list(log):
        if entry in ("ort.capture.begin", "ort.capture.end"):
            capturing = entry == "ort.capture.begin"
        elif capturing:
            during.append(entry)
    assert log.count("ort.capture.begin") == 2  # a graph per batch size, max_batch 2
    assert during == []


def test_capture_gate_waits_for_work_in_flight_and_holds_new_work_until_the_capture_ends() -> None:
    gate, order = CaptureGate(), []
    gate.enter()  # a run in flight

    def capture() -> None:
        with gate.exclusive():
            order.append("capture")

    def run() -> None:
        with gate.shared():
            order.append("run")

    capturer = threading.Thread(target=capture)
    capturer.start()
    wait_for(lambda: gate._waiting == 1, 5, "the capture waits")
    runner = threading.Thread(target=run)
    runner.start()  # arrives while a capture waits: goes after it
    time.sleep(0.05)
    assert order == []
    gate.leave()
    capturer.join(5)
    runner.join(5)
    assert order == ["capture", "run"]


def test_fake_ort_close_frees_the_binding_then_the_session_then_its_weights_then_the_buffers_then_the_stream(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    fake_ort(monkeypatch, log)
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    backend.reserve([MLP], [REALTIME], backend.free_bytes())
    runner = backend.load(MLP, REALTIME)
    del log[:]
    runner.close()
    assert log == [
        "binding.clear_inputs",
        "binding.clear_outputs",
        "binding.freed",
        "session.freed",
        "device.free",  # the model's weights, whose last holder this runner was: after the session
        "staged.close",  # x
        "staged.close",  # scores
        "stream.close",
    ]


# --- TensorRT ---------------------------------------------------------------------


def trt_runner(trt: FakeTrt, klass: ClassConfig = REALTIME) -> tensorrt_runner.TensorRtRunner:
    return tensorrt_runner.TensorRtRunner(trt, trt.engine, MLP.signature, klass)


def test_fake_trt_close_frees_graphs_then_context_then_its_memory_then_buffers_then_stream(
    log: list[str], fake_cuda: FakeCuda
) -> None:
    runner = trt_runner(FakeTrt(log), replace(REALTIME, cuda_graph=True))
    assert log.count("capture.end") == 2  # one graph per batch size, 1 and 2
    del log[:]
    runner.close()
    assert log == [
        "stream.synchronize",
        "graph.destroy",
        "graph.destroy",
        "context.freed",
        "device.free",
        "staged.close",
        "staged.close",
        "stream.close",
    ]


@pytest.mark.parametrize(
    ("fail", "message"),
    [
        ("profile", "refused optimization profile 0"),
        ("shape", r"refused shape \[2, 64\] for x"),
        ("execute", "execute_async_v3 failed"),
        ("capture", "execute_async_v3 failed"),
    ],
)
def test_fake_trt_a_failed_call_stops_the_load_and_frees_what_it_made(
    log: list[str], fake_cuda: FakeCuda, fail: str, message: str
) -> None:
    with pytest.raises(BackendError, match=message):
        trt_runner(FakeTrt(log, fail=fail), replace(REALTIME, cuda_graph=True))
    assert log.count("stream.create") == 1 and log[-1] == "stream.close"
    assert "context.freed" in log and "device.free" in log
    assert log.count("capture.begin") == log.count("capture.end")  # never left capturing


def test_fake_trt_a_failed_shape_at_run_time_is_an_error_not_a_wrong_answer(
    log: list[str], fake_cuda: FakeCuda
) -> None:
    trt = FakeTrt(log)
    runner = trt_runner(trt)
    trt.fail = "shape"
    with pytest.raises(BackendError, match="refused shape"):
        runner.run(MLP.signature.zeros(1), ["scores"])
    runner.close()


def test_fake_trt_an_engine_whose_profile_is_smaller_than_max_batch_is_refused(
    log: list[str], fake_cuda: FakeCuda
) -> None:
    with pytest.raises(BackendError, match=r"at most 2 rows of x, fewer than classes\.bulk\.max_batch = 16"):
        trt_runner(FakeTrt(log, profile_max=2), ClassConfig("bulk", order=0, max_batch=16))
    assert log[-1] == "stream.close"


def test_fake_trt_engine_builds_ask_for_no_auxiliary_streams() -> None:
    from edged.models.engines import ShapeRange
    from edged.toolchain.engine import builder_config

    config = SimpleNamespace(add_optimization_profile=lambda profile: None)
    profile = SimpleNamespace(set_shape=lambda *args: None)
    builder = SimpleNamespace(create_builder_config=lambda: config, create_optimization_profile=lambda: profile)
    shapes = {"x": ShapeRange((1, 64), (4, 64), (8, 64))}
    assert builder_config(SimpleNamespace(), builder, shapes, version_compatible=False).max_aux_streams == 0


# --- the cuda layer's graphs, on a fake cuda-python runtime ---------------------------


def use_fake_runtime(monkeypatch: pytest.MonkeyPatch, log: list[str]) -> None:
    """The cuda layer's runtime module, as the cuda layer and the check of each call reach it."""
    runtime = fake_runtime(log)
    monkeypatch.setattr(cuda_layer, "runtime", lambda: runtime)
    monkeypatch.setattr(cuda_calls, "runtime", lambda: runtime)


def fake_runtime(log: list[str]) -> SimpleNamespace:
    def call(name: str, *values: object) -> object:
        return lambda *args: (log.append(name), (0, *values))[1]

    return SimpleNamespace(
        cudaError_t=SimpleNamespace(cudaSuccess=0),
        cudaStreamCaptureMode=SimpleNamespace(cudaStreamCaptureModeThreadLocal=1),
        cudaStreamBeginCapture=call("begin"),
        cudaStreamEndCapture=call("end", "graph"),
        cudaGraphInstantiate=call("instantiate", "exec"),
        cudaGraphDestroy=call("graph.destroy"),
        cudaGraphExecDestroy=call("exec.destroy"),
        cudaGraphLaunch=call("launch"),
    )


def test_fake_cuda_runtime_capture_frees_the_captured_graph_and_close_the_executable(
    monkeypatch: pytest.MonkeyPatch, log: list[str]
) -> None:
    use_fake_runtime(monkeypatch, log)
    stream = object.__new__(cuda_layer.Stream)
    stream.handle = 7
    graph = stream.capture(lambda: log.append("enqueue"))
    stream.launch(graph)
    graph.close()
    assert log == ["begin", "enqueue", "end", "instantiate", "graph.destroy", "launch", "exec.destroy"]


def test_fake_cuda_runtime_a_failed_capture_leaves_capture_mode_and_frees_its_graph(
    monkeypatch: pytest.MonkeyPatch, log: list[str]
) -> None:
    use_fake_runtime(monkeypatch, log)
    stream = object.__new__(cuda_layer.Stream)
    stream.handle = 7

    def enqueue() -> None:
        raise BackendError("execute_async_v3 failed")

    with pytest.raises(BackendError):
        stream.capture(enqueue)
    assert log == ["begin", "end", "graph.destroy"]


def test_fake_ort_a_runner_given_a_stream_leaves_it_to_its_owner(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    """bench/one_stream.py's ablation puts every lane on one stream, which outlives the runners."""
    fake_ort(monkeypatch, log)
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    backend.reserve([MLP], [REALTIME], backend.free_bytes())
    shared = fake_cuda.Stream(0)
    runner = onnxruntime_cuda_runner.OnnxRuntimeCudaRunner(
        backend._ort, MLP, REALTIME, backend.reservation_of(MLP, REALTIME), stream=shared
    )
    assert runner.stream is shared
    runner.close()
    assert log.count("stream.create") == 1 and "stream.close" not in log
