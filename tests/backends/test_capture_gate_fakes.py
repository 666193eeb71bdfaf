"""The capture gate around every CUDA call that a graph capture forbids, on the fake CUDA
layer and a fake of cuda-python's IPC calls: the loader's copy of a model's weights and
the socket loop's opening of a client's IPC handle wait for a capture to end; the close of
an IPC handle, which a finalizer makes on any thread, never waits and never runs during a
capture. Names say "fake": nothing here shows what a GPU does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from support import wait_for
from support.fake_cuda import FakeCuda
from support.gpu import MLP, REALTIME, fake_ort

from edged.backends import cuda_calls, cuda_ipc, onnxruntime_cuda
from edged.backends.capture_gate import CAPTURE_GATE, CaptureGate

SETTLE_S = 0.2  # long enough for a call that does not wait to have run


def capturing(gate: CaptureGate, log: list[str]) -> tuple[threading.Thread, threading.Event]:
    """A thread inside `gate.exclusive()` until the returned event is set."""
    inside, release = threading.Event(), threading.Event()

    def capture() -> None:
        with gate.exclusive():
            log.append("capture.begin")
            inside.set()
            release.wait(10)
            log.append("capture.end")

    thread = threading.Thread(target=capture)
    thread.start()
    assert inside.wait(10)
    return thread, release


def in_thread(call: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=call)
    thread.start()
    return thread


def test_capture_gate_outside_a_capture_a_deferred_call_runs_at_once() -> None:
    gate, log = CaptureGate(), []
    gate.outside_capture(lambda: log.append("close"))
    assert log == ["close"]


def test_capture_gate_a_call_made_during_a_capture_returns_at_once_and_runs_when_the_capture_ends() -> None:
    gate, log = CaptureGate(), []
    capturer, release = capturing(gate, log)
    caller = in_thread(lambda: gate.outside_capture(lambda: log.append("close")))
    caller.join(SETTLE_S * 10)
    assert not caller.is_alive() and log == ["capture.begin"]  # returned, and did not run
    release.set()
    capturer.join(10)
    assert log == ["capture.begin", "capture.end", "close"]


def test_capture_gate_a_call_made_on_the_capturing_thread_itself_does_not_deadlock() -> None:
    """A finalizer can run on the capturing thread, in the middle of the capture."""
    gate, log = CaptureGate(), []
    with gate.exclusive():
        gate.outside_capture(lambda: log.append("close"))
        assert log == []
    assert log == ["close"]


def test_fake_ort_hold_weights_waits_for_another_lanes_capture_before_copying(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    fake_ort(monkeypatch, log)
    backend = onnxruntime_cuda.OnnxRuntimeCuda()
    backend.reserve([MLP], [REALTIME], backend.free_bytes())
    capturer, release = capturing(CAPTURE_GATE, log)
    held: list[object] = []
    loader = in_thread(lambda: held.append(backend.hold_weights(MLP, [REALTIME])))
    time.sleep(SETTLE_S)
    assert "upload" not in log  # the weights' copy waits
    release.set()
    capturer.join(10)
    loader.join(10)
    assert log.index("capture.end") < log.index("upload")
    held[0].release()  # type: ignore[attr-defined]


def fake_ipc_runtime(log: list[str]) -> SimpleNamespace:
    class Handle:
        def __init__(self) -> None:
            import ctypes

            self.raw = ctypes.create_string_buffer(64)

        def getPtr(self) -> int:  # cuda-python's name
            import ctypes

            return ctypes.addressof(self.raw)

    return SimpleNamespace(
        cudaError_t=SimpleNamespace(cudaSuccess=0),
        CUresult=SimpleNamespace(CUDA_SUCCESS=0),
        cudaIpcMemHandle_t=Handle,
        cudaIpcMemLazyEnablePeerAccess=1,
        cudaIpcOpenMemHandle=lambda handle, flags: (log.append("ipc.open"), (0, 0x7000))[1],
        cudaIpcCloseMemHandle=lambda pointer: (log.append("ipc.close"), (0,))[1],
        CUdeviceptr=int,
        cuMemGetAddressRange=lambda pointer: (0, 0x7000, 4096),
    )


def test_fake_cuda_runtime_an_ipc_open_waits_for_a_capture_and_a_close_during_one_waits_for_its_end(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    fake = fake_ipc_runtime(log)
    for module in (cuda_calls, cuda_ipc):
        monkeypatch.setattr(module, "runtime", lambda: fake)
        monkeypatch.setattr(module, "driver_api", lambda: fake)
    monkeypatch.setattr(fake_cuda, "IpcMemory", cuda_ipc.IpcMemory, raising=False)
    capturer, release = capturing(CAPTURE_GATE, log)
    opened: list[object] = []
    opener = in_thread(lambda: opened.append(onnxruntime_cuda.open_ipc(bytes(64), 1024)))
    time.sleep(SETTLE_S)
    assert "ipc.open" not in log  # the socket loop waits for the capture
    release.set()
    capturer.join(10)
    opener.join(10)
    assert log == ["capture.begin", "capture.end", "ipc.open"]
    capturer, release = capturing(CAPTURE_GATE, log)
    opened.clear()  # the last reference: its finalizer closes the handle, here, during a capture
    time.sleep(SETTLE_S)
    assert log[-1] == "capture.begin"
    release.set()
    capturer.join(10)
    wait_for(lambda: log[-1] == "ipc.close", 5, "the close, once the capture ended")
    assert log[-3:] == ["capture.begin", "capture.end", "ipc.close"]
