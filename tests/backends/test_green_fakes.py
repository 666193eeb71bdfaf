"""SM partitioning per class (edged.backends.green), on fakes: there is no GPU here.

A fake `cuda.bindings.driver` (its names checked by hand against cuda-bindings 13.5.0,
which imports without a GPU) records the calls; nothing here shows that a green
context works on a device. bench/gpu_verify.sh is where one will.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from support.gpu import MLP, fake_cuda_layer, fake_ort

from edged.backends import cuda, green, onnxruntime_cuda, onnxruntime_cuda_runner
from edged.config import ClassConfig

SMS = 132


class FakeDriver(types.ModuleType):
    """cuda.bindings.driver's green-context calls, answering as an H100 would, logging each."""

    def __init__(self, log: list[str], fail: str = "") -> None:
        super().__init__("cuda.bindings.driver")
        self.log, self.fail = log, fail
        self.CUresult = types.SimpleNamespace(CUDA_SUCCESS=0)
        self.CUdevResourceType = types.SimpleNamespace(CU_DEV_RESOURCE_TYPE_SM="SM")
        self.CUgreenCtxCreate_flags = types.SimpleNamespace(CU_GREEN_CTX_DEFAULT_STREAM=1)
        self.CUstream_flags = types.SimpleNamespace(CU_STREAM_NON_BLOCKING=1)

    def _call(self, name: str, *values: Any) -> tuple[Any, ...]:
        self.log.append(name)
        return (999, *(None for _ in values)) if name == self.fail else (0, *values)

    def cuGetErrorName(self, status: int) -> tuple[int, bytes]:
        return 0, b"CUDA_ERROR_NOT_SUPPORTED"

    def cuGetErrorString(self, status: int) -> tuple[int, bytes]:
        return 0, b"operation not supported"

    # Stream memory operations (edged.backends.cuda.Stream.wait_value32).
    CUstreamWaitValue_flags = types.SimpleNamespace(CU_STREAM_WAIT_VALUE_GEQ=0)
    CUdeviceptr = int

    def cuStreamWaitValue32(self, stream: int, address: int, value: int, flags: int) -> tuple[Any, ...]:
        self.log.append(f"cuStreamWaitValue32 {stream:#x} {address:#x} {value} {flags}")
        return self._call("cuStreamWaitValue32")

    def cuDeviceGet(self, ordinal: int) -> tuple[Any, ...]:
        return self._call("cuDeviceGet", f"dev{ordinal}")

    def cuDeviceGetDevResource(self, dev: str, kind: str) -> tuple[Any, ...]:
        return self._call("cuDeviceGetDevResource", types.SimpleNamespace(sm=types.SimpleNamespace(smCount=SMS)))

    def cuDevSmResourceSplitByCount(self, groups: int, every: Any, flags: int, count: int) -> tuple[Any, ...]:
        self.log.append(f"split {groups} {count}")
        rounded = -(-count // 8) * 8  # Hopper's granularity
        return (0, [types.SimpleNamespace(sm=types.SimpleNamespace(smCount=rounded))], 1, None)

    def cuDevResourceGenerateDesc(self, resources: list[Any], count: int) -> tuple[Any, ...]:
        return self._call("cuDevResourceGenerateDesc", "desc")

    def cuGreenCtxCreate(self, desc: str, dev: str, flags: int) -> tuple[Any, ...]:
        return self._call("cuGreenCtxCreate", "green")

    def cuGreenCtxStreamCreate(self, context: str, flags: int, priority: int) -> tuple[Any, ...]:
        self.log.append(f"stream priority {priority}")
        return self._call("cuGreenCtxStreamCreate", 0x5EED)

    def cuGreenCtxDestroy(self, context: str) -> tuple[Any, ...]:
        return self._call("cuGreenCtxDestroy")


class FakeRuntime(types.ModuleType):
    """What Stream.close asks of cuda.bindings.runtime."""

    def __init__(self, log: list[str]) -> None:
        super().__init__("cuda.bindings.runtime")
        self.log = log
        self.cudaError_t = types.SimpleNamespace(cudaSuccess=0)

    def cudaStreamDestroy(self, handle: int) -> tuple[int]:
        self.log.append(f"cudaStreamDestroy {handle:#x}")
        return (0,)


@pytest.fixture
def log() -> list[str]:
    return []


def fake_bindings(monkeypatch: pytest.MonkeyPatch, log: list[str], fail: str = "") -> None:
    package = types.ModuleType("cuda.bindings")
    package.driver, package.runtime = FakeDriver(log, fail), FakeRuntime(log)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", package)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", package.driver)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", package.runtime)  # type: ignore[attr-defined]


def test_fake_driver_a_green_stream_holds_its_context_until_closed(monkeypatch: pytest.MonkeyPatch, log) -> None:
    fake_bindings(monkeypatch, log)
    stream = green.green_stream(100, -1)
    assert stream.pointer == 0x5EED and stream.priority == -1
    assert log == [
        "cuDeviceGet",
        "cuDeviceGetDevResource",
        "split 1 100",
        "cuDevResourceGenerateDesc",
        "cuGreenCtxCreate",
        "stream priority -1",
        "cuGreenCtxStreamCreate",
    ]
    stream.close()
    assert log[-2:] == ["cudaStreamDestroy 0x5eed", "cuGreenCtxDestroy"]  # the stream before its context
    stream.close()
    assert log.count("cuGreenCtxDestroy") == 1


def test_fake_driver_a_failed_stream_destroys_the_context_and_names_the_call(
    monkeypatch: pytest.MonkeyPatch, log
) -> None:
    fake_bindings(monkeypatch, log, fail="cuGreenCtxStreamCreate")
    with pytest.raises(cuda.CudaError, match="cuGreenCtxStreamCreate failed: CUDA_ERROR_NOT_SUPPORTED"):
        green.green_stream(64, 0)
    assert log[-1] == "cuGreenCtxDestroy"


def test_fake_driver_wait_value32_holds_the_stream_until_the_word_is_at_least_the_value(
    monkeypatch: pytest.MonkeyPatch, log
) -> None:
    """Argument order (stream, address, value, flags) and the GEQ flag as cuda-bindings 13.5.0's
    cuStreamWaitValue32 documents them; an unsupported device's status names the call and the error."""
    fake_bindings(monkeypatch, log)
    stream = cuda.Stream.adopt(0x5EED, 0, lambda: None)
    stream.wait_value32(0xF1A6, 1)
    assert log == ["cuStreamWaitValue32 0x5eed 0xf1a6 1 0", "cuStreamWaitValue32"]
    fake_bindings(monkeypatch, log, fail="cuStreamWaitValue32")
    with pytest.raises(cuda.CudaError, match="cuStreamWaitValue32 failed: CUDA_ERROR_NOT_SUPPORTED: operation not"):
        stream.wait_value32(0xF1A6, 1)


def test_fake_driver_more_sms_than_the_device_has_is_refused_in_one_sentence(
    monkeypatch: pytest.MonkeyPatch, log
) -> None:
    fake_bindings(monkeypatch, log)
    with pytest.raises(cuda.CudaError, match=f"sm_count 200 is more than the {SMS} SMs of device 0"):
        green.green_stream(200, 0)
    assert "cuGreenCtxCreate" not in log


def test_fake_ort_a_class_with_sm_count_computes_on_a_green_stream(monkeypatch: pytest.MonkeyPatch, log) -> None:
    """The ONNX Runtime runner hands the green context's stream to its session, where a
    class without sm_count gets a plain priority stream."""
    fake = fake_cuda_layer(monkeypatch, log)

    def green_stream(sm_count: int, priority: int) -> Any:
        log.append(f"green {sm_count}")
        return fake.Stream(priority)

    monkeypatch.setattr(onnxruntime_cuda_runner, "green", types.SimpleNamespace(green_stream=green_stream))
    fake_ort(monkeypatch, log)
    for sm_count in (100, 0):
        klass = ClassConfig("bulk", order=2, sm_count=sm_count)
        backend = onnxruntime_cuda.OnnxRuntimeCuda()
        backend.reserve([MLP], [klass], backend.free_bytes())
        runner = onnxruntime_cuda_runner.OnnxRuntimeCudaRunner(
            backend._ort, MLP, klass, backend.reservation_of(MLP, klass)
        )
        runner.close()
    assert [entry for entry in log if entry.startswith(("green", "stream.create"))] == [
        "green 100",
        "stream.create",  # the fake green stream
        "stream.create",  # sm_count 0: a plain one, no green context
    ]
