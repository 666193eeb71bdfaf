"""CUDA IPC on the GPU backends, on fakes of cuda-python (its runtime and driver) and of
the cuda layer: the handle is opened once with lazy peer access and closed when the last
reference to it goes; a device input is copied device to device on the lane's stream,
never through the host; each runner hands it there. Names say "fake": nothing here shows
that a GPU does what the fakes do (bench/gpu_check_ipc.py checks that, on a GPU)."""

from __future__ import annotations

import ctypes
import gc
from types import SimpleNamespace

import numpy as np
import pytest
from support.fake_cuda import FakeCuda, FakeTrt
from support.gpu import MLP, REALTIME, fake_ort

from edged.backends import (
    BackendError,
    DeviceTensor,
    cuda_calls,
    cuda_ipc,
    cuda_memory,
    onnxruntime_cuda,
    tensorrt,
    tensorrt_runner,
)
from edged.backends import cuda as cuda_layer

BASE, SIZE = 0x7000_0000, 4096  # the fake allocation an opened handle points at


def fake_runtime(log: list[str]) -> SimpleNamespace:
    """cuda-python's runtime and driver as far as IPC and copies go, each call logged."""
    host: list[ctypes.Array[ctypes.c_char]] = []  # pinned buffers, kept alive

    class Handle:
        def __init__(self) -> None:
            self.raw = ctypes.create_string_buffer(64)

        def getPtr(self) -> int:  # cuda-python's name
            return ctypes.addressof(self.raw)

    def malloc_host(nbytes: int) -> tuple[int, int]:
        host.append(ctypes.create_string_buffer(nbytes))
        return 0, ctypes.addressof(host[-1])

    def open_handle(handle: Handle, flags: int) -> tuple[int, int]:
        log.append(f"ipc.open {handle.raw.raw[:4].decode()} flags={flags}")
        return 0, BASE

    def memcpy(dst: int, src: int, nbytes: int, kind: str, stream: int) -> tuple[int]:
        log.append(f"memcpy {kind} {dst:#x} <- {src:#x} {nbytes} on {stream}")
        return (0,)

    return SimpleNamespace(
        cudaError_t=SimpleNamespace(cudaSuccess=0),
        CUresult=SimpleNamespace(CUDA_SUCCESS=0),
        cudaIpcMemHandle_t=Handle,
        cudaIpcMemLazyEnablePeerAccess=1,
        cudaIpcOpenMemHandle=open_handle,
        cudaIpcCloseMemHandle=lambda pointer: (log.append(f"ipc.close {pointer:#x}"), (0,))[1],
        CUdeviceptr=int,
        cuMemGetAddressRange=lambda pointer: (0, BASE, SIZE),
        cudaMemcpyKind=SimpleNamespace(cudaMemcpyDeviceToDevice="D2D", cudaMemcpyHostToDevice="H2D"),
        cudaMemcpyAsync=memcpy,
        cudaMalloc=lambda nbytes: (0, 0x100),
        cudaStreamSynchronize=lambda stream: (log.append(f"synchronize {stream}"), (0,))[1],
        cudaMallocHost=malloc_host,
    )


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch, log: list[str]) -> SimpleNamespace:
    fake = fake_runtime(log)
    for module in (cuda_calls, cuda_ipc, cuda_memory, cuda_layer):
        monkeypatch.setattr(module, "runtime", lambda: fake)
    monkeypatch.setattr(cuda_calls, "driver_api", lambda: fake)
    monkeypatch.setattr(cuda_ipc, "driver_api", lambda: fake)
    return fake


def test_fake_cuda_runtime_ipc_opens_once_with_lazy_peer_access_and_closes_after_its_last_reader(
    runtime: SimpleNamespace, log: list[str]
) -> None:
    memory = cuda_ipc.IpcMemory(b"abcd" + bytes(60), 1024)
    assert log == ["ipc.open abcd flags=1"] and memory.pointer == BASE
    reader = DeviceTensor(memory, 64, 256, np.dtype(np.float32), (1, 64))
    del memory  # the region forgotten: a request still reads it
    gc.collect()
    assert log == ["ipc.open abcd flags=1"]
    del reader  # the request answered and let go
    assert log == ["ipc.open abcd flags=1", f"ipc.close {BASE:#x}"]


def test_fake_cuda_runtime_ipc_a_size_past_the_allocation_is_refused_and_closed(
    runtime: SimpleNamespace, log: list[str]
) -> None:
    with pytest.raises(cuda_calls.CudaError, match="its allocation has 4096 bytes, fewer than the 4097 registered"):
        cuda_ipc.IpcMemory(bytes(64), SIZE + 1)
    assert log == ["ipc.open \0\0\0\0 flags=1", f"ipc.close {BASE:#x}"]


def test_fake_cuda_runtime_a_device_input_is_copied_device_to_device_on_the_lanes_stream(
    runtime: SimpleNamespace, log: list[str]
) -> None:
    stream = object.__new__(cuda_layer.Stream)
    stream.handle = 7
    staged = cuda_memory.Staged(np.dtype(np.float32), 1024)
    memory = SimpleNamespace(pointer=BASE, nbytes=SIZE)
    tensor = DeviceTensor(memory, 64, 512, np.dtype(np.float32), (2, 64))
    cuda_memory.copy_run_keeping(stream, [(staged, tensor)], lambda: log.append("enqueue"), list)
    assert log == [f"memcpy D2D 0x100 <- {BASE + 64:#x} 512 on 7", "enqueue", "synchronize 7"]
    assert not any("H2D" in line for line in log)
    wrong = DeviceTensor(memory, 0, 512, np.dtype(np.float16), (4, 64))
    del log[:]
    with pytest.raises(cuda_calls.CudaError, match="never converted"):
        cuda_memory.copy_run_keeping(stream, [(staged, wrong)], lambda: None, list)
    assert log == ["synchronize 7"]  # a failed call still waits for what it enqueued


def test_fake_ort_and_trt_runners_hand_a_device_input_to_the_copy_on_their_own_stream(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    tensor = DeviceTensor(SimpleNamespace(pointer=BASE, nbytes=SIZE), 0, 2 * 64 * 4, np.dtype(np.float32), (2, 64))
    fake_ort(monkeypatch, log)
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    backend.reserve([MLP], [REALTIME], backend.free_bytes())
    trt = FakeTrt(log)
    for runner in (
        backend.load(MLP, REALTIME),
        tensorrt_runner.TensorRtRunner(trt, trt.engine, MLP.signature, REALTIME),
    ):
        fake_cuda.copied.clear()
        runner.run({"x": tensor}, ["scores"])
        assert [(stream, value) for stream, _, value in fake_cuda.copied] == [(runner.stream, tensor)]
        runner.close()


def test_fake_cuda_open_ipc_failure_is_a_backend_error_with_cudas_words(
    monkeypatch: pytest.MonkeyPatch, fake_cuda: FakeCuda
) -> None:
    def refuse(handle: bytes, nbytes: int) -> None:
        raise RuntimeError("cudaIpcOpenMemHandle failed: cudaErrorInvalidValue: invalid argument")

    monkeypatch.setattr(fake_cuda, "IpcMemory", refuse, raising=False)
    with pytest.raises(BackendError, match="cannot open this CUDA IPC handle: cudaIpcOpenMemHandle failed"):
        onnxruntime_cuda.open_ipc(bytes(64), 16)


def test_fake_cuda_a_trt_fallback_runner_on_the_cpu_reads_a_device_input_through_the_host(
    log: list[str], fake_cuda: FakeCuda
) -> None:
    seen: dict[str, np.ndarray] = {}
    cpu = SimpleNamespace(run=lambda inputs, names: seen.update(inputs) or [], close=lambda: None)
    tensor = DeviceTensor(SimpleNamespace(pointer=BASE, nbytes=SIZE), 0, 256, np.dtype(np.float32), (1, 64))
    tensorrt.HostInputs(cpu).run({"x": tensor}, ["scores"])
    assert log == ["download_now"] and isinstance(seen["x"], np.ndarray) and seen["x"].shape == (1, 64)
