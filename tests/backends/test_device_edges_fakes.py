"""A GPU runner's kept outputs (edged.backends.KeepsOnDevice), on a fake of cuda-python
whose "device" memory is host memory, so that bytes can be read back: the real cuda
layer, TensorRT's and ONNX Runtime's runners, and fakes of their engine and session
that compute (x * 2 + 1) from the address they are bound to. Names say "fake": nothing
here shows that a GPU does this (bench/gpu_checks.py device-edges checks that, on one)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from support.fake_cuda import FakeOrt, FakeTrt, _Context
from support.gpu import MLP, REALTIME, fake_ort

from edged.backends import (
    DeviceTensor,
    KeepsOnDevice,
    cuda_calls,
    cuda_memory,
    onnxruntime_cuda_runner,
    tensorrt_runner,
)
from edged.backends import cuda as cuda_layer
from edged.backends.device_weights import DeviceWeights
from edged.backends.gpu_memory import ModelReservation, io_bytes


def host_view(pointer: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
    count = int(np.prod(shape))
    raw = (ctypes.c_byte * (count * dtype.itemsize)).from_address(pointer)
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


def memory_runtime(log: list[str]) -> SimpleNamespace:
    """cuda-python's runtime with host memory for device memory: every copy moves bytes."""
    held: dict[int, ctypes.Array[ctypes.c_char]] = {}

    def malloc(nbytes: int) -> tuple[int, int]:
        buffer = ctypes.create_string_buffer(max(nbytes, 1))
        held[ctypes.addressof(buffer)] = buffer
        return 0, ctypes.addressof(buffer)

    def free(pointer: int) -> tuple[int]:
        held.pop(pointer)
        return (0,)

    def copy(dst: int, src: int, nbytes: int, kind: str, stream: int = 0) -> tuple[int]:
        log.append(f"memcpy {kind} {nbytes}")
        ctypes.memmove(dst, src, nbytes)
        return (0,)

    return SimpleNamespace(
        held=held,
        cudaError_t=SimpleNamespace(cudaSuccess=0),
        cudaSetDevice=lambda device: (0,),
        cudaDeviceGetStreamPriorityRange=lambda: (0, 0, -5),
        cudaStreamNonBlocking=1,
        cudaStreamCreateWithPriority=lambda flags, priority: (0, 7),
        cudaStreamSynchronize=lambda stream: (log.append("synchronize"), (0,))[1],
        cudaStreamDestroy=lambda stream: (0,),
        cudaMalloc=malloc,
        cudaMallocHost=malloc,
        cudaFree=free,
        cudaFreeHost=free,
        cudaMemcpyKind=SimpleNamespace(
            cudaMemcpyHostToDevice="H2D", cudaMemcpyDeviceToHost="D2H", cudaMemcpyDeviceToDevice="D2D"
        ),
        cudaMemcpyAsync=copy,
        cudaMemcpy=copy,
    )


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch, log: list[str]) -> Iterator[SimpleNamespace]:
    fake = memory_runtime(log)
    for module in (cuda_calls, cuda_memory, cuda_layer):
        monkeypatch.setattr(module, "runtime", lambda: fake)
    yield fake
    assert not fake.held  # every runner closed frees all it allocated


def twice_plus_one(x: np.ndarray) -> np.ndarray:
    return x * 2 + 1


class ComputingContext(_Context):
    """The fake engine's context, with an output as wide as its input, computed from the
    bytes at the addresses it is given."""

    def __init__(self, trt: FakeTrt) -> None:
        super().__init__(trt)
        self.addresses: dict[str, int] = {}

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return (self._rows, 64)

    def set_tensor_address(self, name: str, pointer: int) -> None:
        self.addresses[name] = pointer

    def execute_async_v3(self, stream: int) -> bool:
        shape, f32 = (self._rows, 64), np.dtype(np.float32)
        host_view(self.addresses["scores"], f32, shape)[:] = twice_plus_one(host_view(self.addresses["x"], f32, shape))
        return True


def trt_runner(log: list[str]) -> tensorrt_runner.TensorRtRunner:
    trt = FakeTrt(log)
    trt.engine.create_execution_context = lambda strategy: ComputingContext(trt)
    return tensorrt_runner.TensorRtRunner(trt, trt.engine, MLP.signature, REALTIME)


class ComputingBinding:
    def __init__(self) -> None:
        self.bound: dict[str, tuple[int, tuple[int, ...]]] = {}

    def bind_input(self, name: str, device: str, device_id: int, dtype: Any, shape: list[int], pointer: int) -> None:
        self.bound[name] = (pointer, tuple(shape))

    bind_output = bind_input

    def clear_binding_inputs(self) -> None: ...

    def clear_binding_outputs(self) -> None: ...


class ComputingSession:
    """A session of a model x[N, 64] -> scores[N, 10] that computes into the bound buffers."""

    def get_providers(self) -> list[str]:
        return ["CUDAExecutionProvider"]

    def io_binding(self) -> ComputingBinding:
        self.binding = ComputingBinding()
        return self.binding

    def run_with_iobinding(self, binding: ComputingBinding, options: Any) -> None:
        (x, x_shape), (scores, scores_shape) = binding.bound["x"], binding.bound["scores"]
        f32 = np.dtype(np.float32)
        host_view(scores, f32, scores_shape)[:] = twice_plus_one(host_view(x, f32, x_shape))[:, :10]


def ort_runner(monkeypatch: pytest.MonkeyPatch, log: list[str]) -> onnxruntime_cuda_runner.OnnxRuntimeCudaRunner:
    ort: FakeOrt = fake_ort(monkeypatch, log)
    monkeypatch.setattr(ort, "InferenceSession", lambda *args, **kwargs: ComputingSession(), raising=False)
    # The weights are not what is checked here: an empty allocation stands in for them.
    monkeypatch.setattr(
        onnxruntime_cuda_runner,
        "load_device_weights",
        lambda ort, path, device: DeviceWeights(cuda_layer.DeviceBuffer(1), {}),
    )
    reservation = ModelReservation(MLP.name, 1, io_bytes(MLP, REALTIME.max_batch), 0)
    return onnxruntime_cuda_runner.OnnxRuntimeCudaRunner(ort, MLP, REALTIME, reservation)


def test_fake_cuda_memory_trt_a_kept_output_is_its_own_buffer_with_the_bytes_run_downloads(
    runtime: SimpleNamespace, log: list[str]
) -> None:
    runner = trt_runner(log)
    assert isinstance(runner, KeepsOnDevice)
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    downloaded = runner.run({"x": x}, ["scores"])[0]
    np.testing.assert_array_equal(downloaded, twice_plus_one(x))
    del log[:]
    (kept,) = runner.run_keeping({"x": x}, ["scores"], {"scores"})
    assert isinstance(kept, DeviceTensor)
    assert (kept.shape, kept.dtype, kept.nbytes) == ((2, 64), np.dtype(np.float32), 2 * 64 * 4)
    assert kept.pointer == runner._staged["scores"].device.pointer  # the context's own output buffer
    assert log == ["memcpy H2D 512", "synchronize"]  # uploaded, run, waited for: nothing downloaded
    np.testing.assert_array_equal(cuda_layer.download_now(kept), downloaded)
    runner.close()


def test_fake_cuda_memory_trt_a_kept_output_feeds_another_runner_device_to_device_and_dies_at_the_next_run(
    runtime: SimpleNamespace, log: list[str]
) -> None:
    first, second = trt_runner(log), trt_runner(log)
    x = np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32)
    (kept,) = first.run_keeping({"x": x}, ["scores"], {"scores"})
    del log[:]
    (out,) = second.run({"x": kept}, ["scores"])
    assert log == ["memcpy D2D 512", "memcpy D2H 512", "synchronize"]  # the edge never went through the host
    np.testing.assert_array_equal(out, twice_plus_one(twice_plus_one(x)))
    first.run({"x": x}, ["scores"])  # its buffer holds this call's output now
    with pytest.raises(cuda_calls.CudaError, match="ran again or closed"):
        kept.pointer  # noqa: B018
    second.close()
    first.close()


def test_fake_cuda_memory_trt_a_runner_may_take_its_own_kept_output_as_its_next_input(
    runtime: SimpleNamespace, log: list[str]
) -> None:
    """A model that follows itself: the input is copied before the run overwrites the output."""
    runner = trt_runner(log)
    x = np.random.default_rng(3).standard_normal((1, 64)).astype(np.float32)
    (kept,) = runner.run_keeping({"x": x}, ["scores"], {"scores"})
    (out,) = runner.run({"x": kept}, ["scores"])
    np.testing.assert_array_equal(out, twice_plus_one(twice_plus_one(x)))
    runner.close()
    with pytest.raises(cuda_calls.CudaError, match="ran again or closed"):
        kept.pointer  # noqa: B018


def test_fake_cuda_memory_ort_a_kept_output_is_its_bound_buffer_with_the_bytes_run_downloads(
    monkeypatch: pytest.MonkeyPatch, runtime: SimpleNamespace, log: list[str]
) -> None:
    runner = ort_runner(monkeypatch, log)
    assert isinstance(runner, KeepsOnDevice)
    x = np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32)
    downloaded = runner.run({"x": x}, ["scores"])[0]
    np.testing.assert_array_equal(downloaded, twice_plus_one(x)[:, :10])
    del log[:]
    (kept,) = runner.run_keeping({"x": x}, ["scores"], {"scores"})
    assert isinstance(kept, DeviceTensor) and (kept.shape, kept.nbytes) == ((2, 10), 2 * 10 * 4)
    assert kept.pointer == runner._staged["scores"].device.pointer == runner._session.binding.bound["scores"][0]
    assert log == ["memcpy H2D 512", "synchronize"]
    np.testing.assert_array_equal(cuda_layer.download_now(kept), downloaded)
    runner.run({"x": x[:1]}, ["scores"])
    with pytest.raises(cuda_calls.CudaError, match="ran again or closed"):
        kept.pointer  # noqa: B018
    runner.close()


def test_fake_cuda_memory_a_kept_output_of_another_dtype_than_the_input_goes_through_the_host_converted(
    runtime: SimpleNamespace, log: list[str]
) -> None:
    """A client's device input of another dtype is refused (never converted); a runner's
    kept output is converted, as it was when every output was downloaded."""
    stream = object.__new__(cuda_layer.Stream)
    stream.handle = 7
    made, taking = cuda_memory.Staged(np.dtype(np.float32), 32), cuda_memory.Staged(np.dtype(np.float16), 16)
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    host_view(made.device.pointer, np.dtype(np.float32), (2, 4))[:] = values
    kept = cuda_memory.Lender().lend(made, (2, 4))
    (out,) = cuda_memory.copy_run_keeping(stream, [(taking, kept)], lambda: None, lambda: [(taking, (2, 4), None)])
    assert isinstance(out, np.ndarray) and out.dtype == np.float16
    np.testing.assert_array_equal(out, values)
    made.close()
    taking.close()
