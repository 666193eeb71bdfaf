"""The fakes of tests/support/fake_cuda.py put in place of ONNX Runtime's GPU build,
and the model and class the GPU-fake tests run."""

from __future__ import annotations

import sys
from importlib import metadata
from types import SimpleNamespace

import pytest

from edged.backends import (
    device_weights,
    onnxruntime_cuda,
    onnxruntime_cuda_runner,
    onnxruntime_gpu,
    tensorrt,
    tensorrt_runner,
)
from edged.config import ClassConfig
from edged.models.repository import discover
from support import ENGINES
from support.fake_cuda import FakeCuda, FakeOrt

MODELS = discover(ENGINES, "onnxruntime")
MLP = next(m for m in MODELS if m.name == "mlp-light")
REALTIME = ClassConfig("realtime", order=0, max_batch=2, stream_priority=-1)


def fake_cuda_layer(monkeypatch: pytest.MonkeyPatch, log: list[str]) -> FakeCuda:
    """The fake cuda layer, wherever the GPU backends reach it."""
    cuda = FakeCuda(log)
    for module in (onnxruntime_cuda, onnxruntime_cuda_runner, device_weights, tensorrt, tensorrt_runner):
        monkeypatch.setattr(module, "cuda", cuda)
    return cuda


def fake_ort(monkeypatch: pytest.MonkeyPatch, log: list[str], **kwargs: object) -> FakeOrt:
    ort = FakeOrt(log, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "onnxruntime", ort)
    fake_installed(monkeypatch, "onnxruntime-gpu")
    # The libraries themselves cannot be loaded here: each is taken as found.
    monkeypatch.setattr(onnxruntime_gpu, "open_library", lambda name: log.append(f"load {name}"))
    return ort


def fake_installed(monkeypatch: pytest.MonkeyPatch, *names: str, folders: tuple[str, ...] = ()) -> None:
    """importlib.metadata as it would be with the distributions `names` installed, each
    in its folder of `folders` (default: one site folder for all)."""

    def distribution(name: str) -> SimpleNamespace:
        if name not in names:
            raise metadata.PackageNotFoundError(name)
        folder = folders[names.index(name)] if folders else "/venv/site-packages"
        return SimpleNamespace(version="1.31.1", locate_file=lambda path: folder)

    fake = SimpleNamespace(distribution=distribution, PackageNotFoundError=metadata.PackageNotFoundError)
    monkeypatch.setattr(onnxruntime_gpu, "metadata", fake)
