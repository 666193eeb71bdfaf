"""CUDA IPC regions on a real daemon over real sockets, its GPU faked
(tests/support/fake_gpu.py: the "device memory" is a POSIX object the fake maps, its
"handle" the object's name). What this shows is the serving side's wiring: registration
opens once, an input reaches the runner as a DeviceTensor and answers as frames do, the
memory stays open until the last request reading it is answered, and every refusal has
its sentence. Nothing here shows that CUDA IPC works (bench/gpu_check_ipc.py does, on a GPU)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest
import zmq
from support import REPO_ROOT, RunningDaemon, connect, exchange, random_input, receive, start_daemon, wait_for

from edged.client import Client, InvalidArgument
from edged.wire.codec import encode_request
from edged.wire.endpoints import class_endpoint
from edged.wire.messages import ShmRef
from edged.wire.shm import ShmTensor

X = random_input("mlp-light", 3, seed=7)["x"]
RUN_S = 0.3  # each read of a device input waits this long: the test acts meanwhile
OPEN_S = 3.0  # each open of a "-slow" object waits this long
SHM = "[shm]\nenabled = true\nmax_region_mb = 1\nmax_regions_per_peer = 2\n"


@pytest.fixture(scope="module")
def ipc_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ipc") / "ipc.log"


@pytest.fixture(scope="module")
def daemon(ipc_log: Path) -> Iterator[RunningDaemon]:
    saved = dict(os.environ)
    os.environ.update(
        EDGED_FAKE_GPU_FREE_MB="65536",
        EDGED_FAKE_GPU_IPC_LOG=str(ipc_log),
        EDGED_FAKE_GPU_IPC_RUN_S=str(RUN_S),
        EDGED_FAKE_GPU_IPC_OPEN_S=str(OPEN_S),
    )
    try:
        program = [sys.executable, str(REPO_ROOT / "tests" / "support" / "fake_gpu.py")]
        running = start_daemon('[server]\nbackend = "fake-gpu"\n' + SHM, tcp=True, program=program)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    yield running
    running.close()


@pytest.fixture
def memory() -> Iterator[shared_memory.SharedMemory]:
    """The client's "device allocation", holding X."""
    made = shared_memory.SharedMemory(name=f"edged-ipc-{os.getpid()}-{time.monotonic_ns()}", create=True, size=4096)
    np.frombuffer(made.buf, np.float32, X.size)[:] = X.reshape(-1)
    yield made
    made.unlink()
    made.close()


def handle_of(memory: shared_memory.SharedMemory) -> bytes:
    return memory.name.lstrip("/").encode().ljust(64, b"\0")


def lines(ipc_log: Path) -> list[str]:
    return ipc_log.read_text().splitlines() if ipc_log.exists() else []


def test_fake_gpu_ipc_region_opens_once_and_its_input_answers_as_frames_do(
    daemon: RunningDaemon, memory: shared_memory.SharedMemory, ipc_log: Path
) -> None:
    name = memory.name.lstrip("/")
    with Client(daemon.ipc) as client:
        expected = client.infer("mlp-light", {"x": X})["scores"]
        region = client.register_cuda_ipc(handle_of(memory), memory.size)
        for _ in range(2):
            got = client.infer("mlp-light", {"x": region.tensor(0, X.shape)}, klass="bulk", deadline_ms=10_000)[
                "scores"
            ]
            np.testing.assert_array_equal(got, expected)
        assert client.stats()["shm"] == {"regions": 1, "bytes": memory.size}
        assert lines(ipc_log).count(f"open {name}") == 1
        assert lines(ipc_log).count("read x") >= 2
        client.unregister(region)
    wait_for(lambda: f"close {name}" in lines(ipc_log), 5, "the forgotten region to be closed")


def test_fake_gpu_ipc_region_is_closed_only_after_the_last_request_reading_it_is_answered(
    daemon: RunningDaemon, memory: shared_memory.SharedMemory, ipc_log: Path
) -> None:
    name = memory.name.lstrip("/")
    context = zmq.Context()
    sock = connect(context, daemon.ipc)
    try:
        register = encode_request(1, "shm_register", region=ShmRef("", 0, memory.size), cuda_ipc=handle_of(memory))
        reply = exchange(sock, register)
        assert reply.status == "OK", reply.header
        x = ShmTensor(ShmRef(reply.header["region"], 0, X.nbytes), "float32", X.shape)
        sock.send_multipart(encode_request(2, model="mlp-light", klass="bulk", deadline_ms=10_000, inputs={"x": x}))
        wait_for(lambda: f"open {name}" in lines(ipc_log), 5, "the open")
        time.sleep(0.1)  # the request is now inside the (slow) fake runner
        sock.send_multipart(encode_request(3, "shm_unregister", region=ShmRef(reply.header["region"], 0, 0)))
        first = receive(sock)
        assert (first.header["id"], first.status) == (3, "OK")
        assert f"close {name}" not in lines(ipc_log), "closed while a request still reads it"
        second = receive(sock)
        assert (second.header["id"], second.status) == (2, "OK")
        wait_for(lambda: f"close {name}" in lines(ipc_log), 5, "the close after the answer")
        assert lines(ipc_log).count(f"close {name}") == 1
    finally:
        sock.close(linger=0)
        context.term()


def test_fake_gpu_ipc_refusals_each_say_why(daemon: RunningDaemon, memory: shared_memory.SharedMemory) -> None:
    context = zmq.Context()
    sock = connect(context, daemon.ipc)

    def register(handle: bytes, nbytes: int, endpoint: zmq.Socket = sock) -> tuple[str, str]:
        frames = encode_request(1, "shm_register", region=ShmRef("", 0, nbytes), cuda_ipc=handle)
        reply = exchange(endpoint, frames)
        return reply.status, reply.header.get("region") or reply.header.get("error", "")

    try:
        assert register(b"short", 16) == (
            "INVALID_ARGUMENT",
            "'cuda_ipc' must be the 64 bytes of a cudaIpcMemHandle_t, as bin; got 5 bytes",
        )
        status, error = register(handle_of(memory), 2 << 20)
        assert status == "INVALID_ARGUMENT" and "shm.max_region_mb = 1" in error
        status, error = register(handle_of(memory), memory.size + 1)
        assert status == "INVALID_ARGUMENT" and "fewer than the 4097 registered" in error
        status, error = register(b"edged-no-such-object".ljust(64, b"\0"), 16)
        assert status == "INVALID_ARGUMENT" and "cannot open this CUDA IPC handle" in error
        status, handle = register(handle_of(memory), memory.size)
        assert status == "OK"
        # Past its end, and as an output: one clear refusal each.
        past = ShmTensor(ShmRef(handle, memory.size - 4, X.nbytes), "float32", X.shape)
        reply = exchange(sock, encode_request(2, model="mlp-light", inputs={"x": past}))
        assert reply.status == "INVALID_ARGUMENT" and "lie past the end of CUDA IPC region" in reply.header["error"]
        out = {"scores": ShmRef(handle, 0, 3 * 10 * 4)}
        reply = exchange(sock, encode_request(3, model="mlp-light", inputs={"x": X}, outputs_shm=out))
        assert reply.status == "INVALID_ARGUMENT" and "outputs go into POSIX" in reply.header["error"]
        assert register(handle_of(memory), memory.size)[0] == "OK"
        status, error = register(handle_of(memory), memory.size)
        assert status == "INVALID_ARGUMENT" and "shm.max_regions_per_peer" in error
        tcp = connect(context, daemon.tcp)
        try:
            status, error = register(handle_of(memory), memory.size, tcp)
        finally:
            tcp.close(linger=0)
        assert status == "INVALID_ARGUMENT" and "ipc endpoints only" in error
    finally:
        sock.close(linger=0)
        context.term()


def test_a_cpu_daemon_refuses_a_cuda_ipc_region_saying_why() -> None:
    running = start_daemon(SHM)
    try:
        with Client(running.ipc) as client, pytest.raises(InvalidArgument) as refusal:
            client.register_cuda_ipc(b"\0" * 64, 4096)
        assert "CUDA IPC region: this daemon serves on server.backend = 'onnxruntime', not a GPU backend" in str(
            refusal.value
        )
    finally:
        running.close()


def test_fake_gpu_ipc_a_slow_open_holds_up_no_other_loops_request(
    daemon: RunningDaemon, memory: shared_memory.SharedMemory, ipc_log: Path
) -> None:
    """A first open of a CUDA IPC handle maps the client's allocation and may take a while.
    It runs outside the regions' lock, which every loop takes to resolve a request's regions:
    a realtime request reading a region already registered is answered while another
    client's registration, on the shared socket, is still opening (the fake's open of a
    "-slow" object waits OPEN_S; before, the request waited for the open's end)."""
    slow = shared_memory.SharedMemory(name=f"edged-ipc-{os.getpid()}-{time.monotonic_ns()}-slow", create=True, size=64)
    context = zmq.Context()
    try:
        registering, reading = connect(context, daemon.ipc), connect(context, class_endpoint(daemon.ipc, "realtime"))
        register = encode_request(1, "shm_register", region=ShmRef("", 0, memory.size), cuda_ipc=handle_of(memory))
        reply = exchange(reading, register)
        assert reply.status == "OK", reply.header
        x = ShmTensor(ShmRef(reply.header["region"], 0, X.nbytes), "float32", X.shape)
        registering.send_multipart(
            encode_request(2, "shm_register", region=ShmRef("", 0, 64), cuda_ipc=handle_of(slow))
        )
        wait_for(lambda: f"opening {slow.name.lstrip('/')}" in lines(ipc_log), 5, "the slow open to start")
        reading.send_multipart(encode_request(3, model="mlp-light", deadline_ms=10_000, inputs={"x": x}))
        poller = zmq.Poller()
        for sock in (registering, reading):
            poller.register(sock, zmq.POLLIN)
        first = dict(poller.poll(int(OPEN_S * 4000)))
        assert reading in first and registering not in first, "the request waited for another client's open"
        assert receive(reading).status == "OK"
        assert receive(registering).status == "OK"
    finally:
        context.destroy(linger=0)
        slow.unlink()
        slow.close()
