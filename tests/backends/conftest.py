"""The fake CUDA layer the GPU backends' tests run on (tests/support/gpu.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.fake_cuda import FakeCuda
from support.gpu import fake_cuda_layer

from edged.backends.device_weights import DEVICE_WEIGHTS
from edged.backends.tensorrt_engines import ENGINES


@pytest.fixture
def log() -> list[str]:
    return []


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch, log: list[str]) -> Iterator[FakeCuda]:
    cuda = fake_cuda_layer(monkeypatch, log)
    yield cuda
    # Every runner a test made is closed: the process's registries hold nothing after it.
    assert len(DEVICE_WEIGHTS) == 0 and len(ENGINES) == 0 and not cuda.held
