"""The paths bench/compare.py measures edged beside, and the client it measures with.

The floors (the model run in-process; a bare ZeroMQ echo), the naive server (one
thread: recv, decode, run, reply), and RoundTrips, the raw DEALER client that meets
every server alike. Run as a script, it serves:

    python bench/paths.py --serve-echo ENDPOINT
    python bench/paths.py --serve-naive ENDPOINT [--timed]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from edged.wire.codec import encode_request

ROOT = Path(__file__).resolve().parents[1]

MODELS = {"mlp-light": ("x", (1, 64)), "cnn-heavy": ("image", (1, 3, 64, 64))}
# The same, as the load generator (edged.loadgen.sweep.run_load) takes them: each model's input specs.
MODEL_INPUTS = {m: [{"name": n, "dtype": "float32", "shape": [-1, *s[1:]]}] for m, (n, s) in MODELS.items()}
WARMUP = 50  # round trips before the measured ones, not counted
# A server that takes no request for this long is stuck, not slow: a send blocked with no
# peer or at the high-water mark raises zmq.Again then, rather than wait for ever.
STUCK_MS = 60_000


def machine() -> dict[str, Any]:
    """Where a run ran, for beside its figures: lscpu's model and its SIMD flags, the cores
    this process may use, the load average, and the versions that set the speed."""
    import onnxruntime

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    return {
        "cpu": fields.get("Model name", "?").strip(),
        "cpu_flags": [f for f in fields.get("Flags", "").split() if f.startswith(("avx", "amx")) or "vnni" in f],
        "cpus": len(os.sched_getaffinity(0)),
        "load_average": tuple(round(load, 2) for load in os.getloadavg()),
        "python": sys.version.split()[0],
        "onnxruntime": onnxruntime.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


def machine_line(where: dict[str, Any]) -> str:
    """`machine()` in one line."""
    flags = " ".join(where["cpu_flags"]) or "no AVX"
    return f"{where['cpu']}, {where['cpus']} CPUs ({flags}); load average {where['load_average']}"


class InProcess:
    """The model run here, one call at a time: the compute floor."""

    def __init__(self) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self._sessions = {m: ort.InferenceSession(str(ROOT / "engines" / m / "model.onnx"), options) for m in MODELS}

    def __call__(self, model: str, runs: int, warmup: int, rows: int = 1) -> list[float]:
        """`runs` calls' times in microseconds, at `rows` rows, after `warmup` not counted."""
        session = self._sessions[model]
        name, shape = MODELS[model]
        x = np.random.default_rng(0).standard_normal((rows, *shape[1:])).astype(np.float32)
        samples = []
        for i in range(runs + warmup):
            start = time.perf_counter_ns()
            session.run(None, {name: x})
            if i >= warmup:
                samples.append((time.perf_counter_ns() - start) / 1000)
        return samples


def dealer(endpoint: str) -> zmq.Socket:
    """A DEALER connected to `endpoint`, whose send and receive give up after STUCK_MS."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.sndtimeo = sock.rcvtimeo = STUCK_MS
    sock.connect(endpoint)
    return sock


class RoundTrips:
    """Closed-loop round trips of one protocol request, raw frames, timed here: one
    DEALER per server, so every server meets the same client."""

    def __init__(self, endpoint: str, klass: str | None = "realtime") -> None:
        """`klass`: the class each request names; None: none (the daemon's default class)."""
        self._sock = dealer(endpoint)
        self._endpoint = endpoint
        self._klass = klass

    def __call__(self, model: str, runs: int, warmup: int) -> list[float]:
        """`runs` round trips' times in microseconds, after `warmup` not counted."""
        return [elapsed_us for elapsed_us, _ in self.with_headers(model, runs, warmup)]

    def with_headers(self, model: str, runs: int, warmup: int) -> list[tuple[float, bytes]]:
        """Each counted round trip's time (us) and its reply's header frame."""
        name, shape = MODELS[model]
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        # The naive server has no classes; edged's requests name one or take its default.
        frames = [bytes(f) for f in encode_request(1, model=model, klass=self._klass, inputs={name: x})]
        sock, samples = self._sock, []
        for i in range(runs + warmup):
            start = time.perf_counter_ns()
            sock.send_multipart(frames)
            if not sock.poll(10_000):
                raise RuntimeError(f"no reply from {self._endpoint}")
            reply = sock.recv_multipart()
            if i >= warmup:  # the first replies warm the path
                samples.append(((time.perf_counter_ns() - start) / 1000, reply[0]))
        return samples

    def close(self) -> None:
        self._sock.close()


def serve_echo(endpoint: str) -> None:
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.bind(endpoint)
    while True:
        sock.send_multipart(sock.recv_multipart())


def serve_naive(endpoint: str, timed: bool = False, steps: Path | None = None, polled: bool = False) -> None:
    """The simplest correct server: everything on one thread, no queues. `timed`: its
    replies carry timing_us as edged's do (for heavy_breakdown.py; compare.py's is not).
    `steps`: a file it rewrites every second with its CPU ns in each step, summed, and
    the requests served (for hot_path.py). `polled`: it waits as edged's loop does, in
    zmq_poll on its socket and an eventfd, then receives without blocking (for
    bare_loop.py: what that wait costs, apart from the rest of edged)."""
    import msgpack
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sessions = {m: ort.InferenceSession(str(ROOT / "engines" / m / "model.onnx"), options) for m in MODELS}
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.bind(endpoint)
    # Untimed, `int()` stands in for the clock (0, in tens of ns): the CPU clock is a system
    # call, and compare.py's naive server must not pay for figures nobody reads.
    cpu = time.thread_time_ns if steps is not None else int
    totals = dict.fromkeys(("requests", "recv", "decode", "run", "encode", "send"), 0)
    if steps is not None:
        threading.Thread(target=_write_every_second, args=(steps, totals), daemon=True).start()
    receive = _polled_receive(sock) if polled else sock.recv_multipart
    while True:
        at_recv = cpu()
        identity, header_frame, *payloads = receive()
        received_ns, at_decode = time.monotonic_ns(), cpu()
        header = msgpack.unpackb(header_frame)
        spec = header["inputs"][0]
        x = np.frombuffer(payloads[0], dtype=spec["dtype"]).reshape(spec["shape"])
        start_ns, at_run = time.monotonic_ns(), cpu()
        (y,) = sessions[header["model"]].run(None, {spec["name"]: x})
        at_encode = cpu()
        reply = {
            "v": 1,
            "id": header["id"],
            "status": "OK",
            "outputs": [{"name": "out", "dtype": "float32", "shape": list(y.shape)}],
        }
        if timed:
            end_ns = time.monotonic_ns()
            reply["timing_us"] = {
                "queue": (start_ns - received_ns) // 1000,
                "compute": (end_ns - start_ns) // 1000,
                "total": (end_ns - received_ns) // 1000,
            }
        frames, at_send = [identity, msgpack.packb(reply), y.tobytes()], cpu()
        sock.send_multipart(frames)
        totals["requests"] += 1
        totals["recv"] += at_decode - at_recv
        totals["decode"] += at_run - at_decode
        totals["run"] += at_encode - at_run
        totals["encode"] += at_send - at_encode
        totals["send"] += cpu() - at_send


def _polled_receive(sock: zmq.Socket) -> Callable[[], list[bytes]]:
    wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # never written: a second thing to wait on
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(wake, zmq.POLLIN)
    nonblocking = int(zmq.NOBLOCK)

    def receive() -> list[bytes]:
        poller.poll()  # no timeout: returns once the socket has a message (the eventfd is never written)
        return sock.recv_multipart(nonblocking)

    return receive


def _write_every_second(path: Path, totals: dict[str, int]) -> None:
    while True:
        time.sleep(1)
        write_whole(path, json.dumps(totals))


def write_whole(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step: a reader never sees it half written."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def helper_server(path: str, endpoint: str, steps: Path | None = None) -> subprocess.Popen[bytes]:
    """The echo (`path` "zmq_echo") or a naive server (any other; "naive_timed": with
    timing_us; "naive_polled": waiting as edged's loop does; `steps`: see serve_naive) in a
    process of its own, given time to load its models."""
    args = ["--serve-echo", endpoint] if path == "zmq_echo" else ["--serve-naive", endpoint]
    args += ["--timed"] if path == "naive_timed" else []
    args += ["--polled"] if path == "naive_polled" else []
    args += ["--steps", str(steps)] if steps is not None else []
    process = subprocess.Popen([sys.executable, __file__, *args])
    time.sleep(0.5 if path == "zmq_echo" else 2.0)
    return process


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve one of compare.py's paths.")
    serve = parser.add_mutually_exclusive_group(required=True)
    serve.add_argument("--serve-echo", metavar="ENDPOINT")
    serve.add_argument("--serve-naive", metavar="ENDPOINT")
    parser.add_argument("--timed", action="store_true", help="the naive server's replies carry timing_us")
    parser.add_argument("--steps", type=Path, help="the naive server writes its CPU per step here")
    parser.add_argument("--polled", action="store_true", help="the naive server waits in zmq_poll, as edged's loop")
    args = parser.parse_args()
    if args.serve_echo:
        serve_echo(args.serve_echo)
    else:
        serve_naive(args.serve_naive, timed=args.timed, steps=args.steps, polled=args.polled)


if __name__ == "__main__":
    main()
