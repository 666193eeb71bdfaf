"""What the daemon tests share: daemons in child processes, short socket paths, free
ports, and raw frames over real ZeroMQ sockets.

Raw frames rather than `edged.client` wherever the wire itself is under test: the
client shares the daemon's codec, so a codec bug would agree with itself there.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import onnxruntime as ort
import zmq

from edged.loadgen.launch import DaemonProcess
from edged.wire.codec import Buffer, Request, decode_request

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINES = REPO_ROOT / "engines"
# Generous: a reply that takes this long is lost, not slow.
REPLY_TIMEOUT_MS = 10_000
MODEL_INPUTS = {"mlp-light": ("x", (64,)), "cnn-heavy": ("image", (3, 64, 64))}


def short_dir() -> Path:
    """A fresh folder with a short path: a unix socket path may not exceed 107 bytes,
    and pytest's tmp_path can come close."""
    return Path(tempfile.mkdtemp(prefix="ed-", dir="/tmp"))


def free_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def established(port: int) -> bool:
    """Whether a tcp connection on 127.0.0.1 to `port` is established (what `ss` shows)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, _remote, state = line.split()[1:4]
        if local == f"0100007F:{port:04X}" and state == "01":
            return True
    return False


@dataclass
class RunningDaemon:
    """`edged serve` in a child process, with where to reach it and its log."""

    process: DaemonProcess
    ipc: str
    tcp: str | None
    folder: Path
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.process.pid

    def alive(self) -> bool:
        return self.process.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 30.0) -> int:
        return self.process.stop(timeout_s)

    def pause(self, timeout_s: float = 10.0) -> None:
        """Stop the daemon (SIGSTOP), returning once none of its threads can run. kill()
        only starts a stop: the process stops when a thread it woke is next scheduled,
        and on a busy box the others serve a request or two meanwhile."""
        os.kill(self.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: all_stopped(self.pid), timeout_s, f"the daemon's threads to stop (pid {self.pid})")
        except AssertionError:
            self.resume()
            raise

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def close(self) -> None:
        self.stop()  # also closes the log of a daemon that already exited
        shutil.rmtree(self.folder, ignore_errors=True)


def all_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is stopped: state T in /proc/<pid>/task/*/stat."""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            states.append(stat.read_text().rpartition(")")[2].split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return bool(states) and all(state == "T" for state in states)


def start_daemon(
    config_text: str | None = None,
    *,
    tcp: bool = False,
    wait: bool = True,
    program: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> RunningDaemon:
    """Start a daemon on an ipc socket (and a tcp port if asked), by default waiting until it
    serves; `program` replaces `python -m edged`, `env` adds to its environment
    (edged.loadgen.launch.DaemonProcess)."""
    folder = short_dir()
    ipc = f"ipc://{folder}/d.sock"
    endpoints = [ipc]
    tcp_endpoint = f"tcp://127.0.0.1:{free_tcp_port()}" if tcp else None
    if tcp_endpoint:
        endpoints.append(tcp_endpoint)
    config = None
    if config_text is not None:
        config = folder / "edged.toml"
        config.write_text(config_text)
    log_path = folder / "daemon.log"
    running = RunningDaemon(
        DaemonProcess(endpoints, config=config, log_path=log_path, program=program, env=env),
        ipc,
        tcp_endpoint,
        folder,
        log_path,
    )
    if wait:
        try:
            running.process.wait_serving(timeout_s=60)
        except RuntimeError as exc:
            log = running.log()
            running.close()
            raise RuntimeError(f"{exc}; daemon log:\n{log}") from None
    return running


# --- raw frames --------------------------------------------------------------


@dataclass
class RawReply:
    header: dict[str, Any]
    payloads: list[bytes]
    delimiter: bool = False  # whether a DEALER saw an empty frame before the header

    @property
    def status(self) -> str:
        return self.header["status"]

    def output(self, index: int = 0) -> np.ndarray:
        spec = self.header["outputs"][index]
        return np.frombuffer(self.payloads[index], dtype=spec["dtype"]).reshape(spec["shape"])


def decoded(frames: list[Buffer]) -> Request:
    """A request as the daemon decodes it, from the frames a client sends."""
    return decode_request([bytes(frame) for frame in frames])


def header(**fields: Any) -> bytes:
    """A msgpack request header, with v=1 unless the test says otherwise."""
    return msgpack.packb({"v": 1, **fields})


def bounded(sock: zmq.Socket, timeout_ms: int = REPLY_TIMEOUT_MS) -> zmq.Socket:
    """`sock`, whose blocking calls raise zmq.Again after `timeout_ms`: a send with no peer
    (a connection refused in its handshake) or at the high-water mark, or a receive with
    nothing coming, would otherwise hang the whole run rather than fail one test."""
    sock.sndtimeo = sock.rcvtimeo = timeout_ms
    return sock


def connect(context: zmq.Context, endpoint: str, kind: int = zmq.DEALER) -> zmq.Socket:
    sock = bounded(context.socket(kind))
    sock.linger = 0
    sock.connect(endpoint)
    return sock


def receive(sock: zmq.Socket, timeout_ms: int = REPLY_TIMEOUT_MS) -> RawReply:
    """One reply, or an AssertionError if none comes: a silent drop is a failure."""
    if not sock.poll(timeout_ms):
        raise AssertionError(f"no reply within {timeout_ms} ms")
    frames = sock.recv_multipart()
    delimiter = sock.type == zmq.DEALER and len(frames) > 1 and frames[0] == b""
    body = frames[1:] if delimiter else frames
    return RawReply(msgpack.unpackb(body[0], raw=False), body[1:], delimiter)


def receive_or_death(sock: zmq.Socket, running: RunningDaemon, timeout_ms: int = REPLY_TIMEOUT_MS) -> RawReply:
    """Like receive, but a daemon that dies instead of replying fails at once, with its log."""
    end = time.monotonic() + timeout_ms / 1000
    while time.monotonic() < end:
        if sock.poll(50):
            return receive(sock, 0)
        if not running.alive():
            code = running.process.process.returncode
            raise AssertionError(
                f"the daemon exited with code {code} instead of replying; its log ends:\n{running.log()[-1500:]}"
            )
    raise AssertionError(f"no reply within {timeout_ms} ms")


def nothing_more(sock: zmq.Socket, wait_ms: int = 100) -> bool:
    return not sock.poll(wait_ms)


def exchange(sock: zmq.Socket, frames: list[Any], timeout_ms: int = REPLY_TIMEOUT_MS) -> RawReply:
    sock.send_multipart(frames, copy=False)
    return receive(sock, timeout_ms)


def random_input(model: str, rows: int, seed: int) -> dict[str, np.ndarray]:
    name, shape = MODEL_INPUTS[model]
    return {name: np.random.default_rng(seed).standard_normal((rows, *shape), dtype=np.float32)}


class Reference:
    """The demo models run in this process by ONNX Runtime: what the daemon must agree with."""

    def __init__(self) -> None:
        self._sessions: dict[str, ort.InferenceSession] = {}

    def session(self, model: str) -> ort.InferenceSession:
        if model not in self._sessions:
            path = ENGINES / model / "model.onnx"
            self._sessions[model] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return self._sessions[model]

    def run(self, model: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self.session(model).run(None, inputs)[0]


def assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def raised_on_thread(
    call: Callable[[], object], expected: type[BaseException], name: str, timeout_s: float = 10.0
) -> BaseException | None:
    """Run `call` on a thread of its own named `name`: the `expected` exception it raised, or
    None where it returned (any other exception fails the test as the thread's). Fails where
    the thread has not ended within `timeout_s`."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except expected as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"{name!r} had not ended within {timeout_s} s"
    return raised[0] if raised else None


def run_edged(
    *args: str, timeout_s: float = 60, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The `edged` command in a child process, as a user runs it (from `cwd`, with `env`
    added to this process's environment); this checkout's edged wherever it runs."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "edged", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
    )


def run_bench(script: str, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    """bench/SCRIPT with `args`, as a user runs it; fails the test, showing its stderr,
    unless it exits 0."""
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done
