"""The GPU runners' life cycles, on fakes of CUDA, ONNX Runtime's CUDA provider and
TensorRT (tests/fake_cuda.py), since none of them can exist here. Each test says
"fake" in its name: it checks the order and the checks of our own code, never that
the real libraries behave as the fakes do.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from fake_cuda import PROVIDER, FakeCuda, FakeOrt
from support import ENGINES

from edged.backends import BackendError, onnxruntime_cuda
from edged.config import ClassConfig
from edged.models.repository import discover

MODELS = discover(ENGINES, "onnxruntime")
MLP = next(m for m in MODELS if m.name == "mlp-light")
REALTIME = ClassConfig("realtime", order=0, max_batch=2, stream_priority=-1)


@pytest.fixture
def log() -> list[str]:
    return []


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch, log: list[str]) -> FakeCuda:
    cuda = FakeCuda(log)
    monkeypatch.setattr(onnxruntime_cuda, "cuda", cuda)
    return cuda


def fake_ort(monkeypatch: pytest.MonkeyPatch, log: list[str], **kwargs: object) -> FakeOrt:
    ort = FakeOrt(log, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "onnxruntime", ort)
    return ort


def test_fake_ort_backend_preloads_the_cuda_libraries_before_its_first_session(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    fake_ort(monkeypatch, log)
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    backend.reserve([MLP], [REALTIME])
    backend.load(MLP, REALTIME).close()
    assert log.index("preload_dlls") < log.index("session.create")


def test_fake_ort_session_placed_on_the_cpu_stops_start_up_in_one_sentence(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    fake_ort(monkeypatch, log, placed="CPUExecutionProvider")
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    backend.reserve([MLP], [REALTIME])
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
    backend.reserve([MLP], [klass])
    backend.load(MLP, klass).close()
    assert ort.captured == {"1", "2"}


def test_fake_ort_close_frees_the_binding_then_the_session_then_the_buffers_then_the_stream(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    fake_ort(monkeypatch, log)
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    backend.reserve([MLP], [REALTIME])
    runner = backend.load(MLP, REALTIME)
    del log[:]
    runner.close()
    assert log == [
        "binding.clear_inputs",
        "binding.clear_outputs",
        "binding.freed",
        "session.freed",
        "staged.close",  # x
        "staged.close",  # scores
        "stream.close",
    ]
