"""Large tensors with payload frames and with shared memory, beside their floors, in one run (issue 24).

    python bench/shm.py [--rounds 8] [--light-per-round 3] [--echo-per-round 5] [--json FILE]

For inputs of 1.2, 11 and 25 MB of float32 (a 3x320x320, a 3x960x960 and a 3x1080x1920
image's bytes), every round measures, in an order rotated from round to round:
  echo          a bare ZeroMQ DEALER/ROUTER echo over ipc of a request of that many
                bytes (the transport floor; the echo sends the bytes back too)
  in_process    the model run by ONNX Runtime in this process, one intra-op thread as
                a lane's sessions have (the compute floor)
  frames        the daemon, through edged.client, the input as a payload frame and the
                output returned as one
  shm           the daemon, through edged.client, the input in a registered
                SharedRegion and the output written into it (outputs_into)
for the light model (mlp-light, x [-1, 64]: bytes / 256 rows) and the heavy one
(cnn-heavy, image [-1, 3, 64, 64]: bytes / 49152 rows, rounded down: 25, 225, 506).
The daemon: built-in classes plus `[shm] enabled = true`, on ipc; requests in class
standard with a 60 s deadline (one 506-row heavy call takes over a second here).
Reported per path: round trip p50 / p99 (of few samples: with 8, p99 is about the slowest),
the daemon's timing_us (total and compute) p50, and the overhead beyond compute, two
ways: the round trip's p50 less the in-process compute's p50 (noisy where compute is
long: its own spread is larger than the overhead), and the p50 of each request's
round trip less the compute the daemon timed for that same request.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from paths import ROOT, dealer, helper_server

from edged.client import Client
from edged.loadgen.launch import DaemonProcess
from edged.wire.codec import encode_request

# Label -> the bytes of that image as float32 (3 channels).
SIZES = {"1.2MB": 3 * 320 * 320 * 4, "11MB": 3 * 960 * 960 * 4, "25MB": 3 * 1080 * 1920 * 4}
# Model -> (input name, one row's shape, output name, bytes per output row)
MODELS = {"mlp-light": ("x", (64,), "scores", 40), "cnn-heavy": ("image", (3, 64, 64), "logits", 40)}
KLASS, DEADLINE_MS = "standard", 60_000.0
CONFIG = "[shm]\nenabled = true\n"
WARMUP = 2  # calls per model and size before the first round, not counted


def rows_for(model: str, nbytes: int) -> int:
    _, row, _, _ = MODELS[model]
    return nbytes // (int(np.prod(row)) * 4)


def stats(samples: list[float]) -> dict[str, float]:
    values = np.array(samples)
    return {
        "n": len(samples),
        "p50": round(float(np.percentile(values, 50)), 1),
        "p99": round(float(np.percentile(values, 99)), 1),
    }


class Cell:
    """One model at one size: its input twice (a plain array, and a view in the region),
    where the shm path's output goes, and a session for the compute floor."""

    def __init__(self, model: str, nbytes: int, region: Any, session: Any) -> None:
        name, row, out_name, out_row_bytes = MODELS[model]
        self.model, self.rows, self.name, self.out_name = model, rows_for(model, nbytes), name, out_name
        x = np.random.default_rng(self.rows).standard_normal((self.rows, *row), dtype=np.float32)
        self.x = x
        self.x_shm = region.array(x.shape, np.float32)
        self.x_shm[...] = x
        self.y_shm = region.array((self.rows, out_row_bytes // 4), np.float32)
        self.session = session
        self.samples: dict[str, list[float]] = {p: [] for p in ("in_process", "frames", "shm")}
        self.daemon: dict[str, dict[str, list[float]]] = {p: {"total": [], "compute": []} for p in ("frames", "shm")}

    def in_process(self) -> None:
        start = time.perf_counter_ns()
        self.session.run(None, {self.name: self.x})
        self.samples["in_process"].append((time.perf_counter_ns() - start) / 1000)

    def through(self, client: Client, path: str, count: bool = True) -> np.ndarray:
        if path == "frames":
            options: dict[str, Any] = {}
            inputs = {self.name: self.x}
        else:
            options = {"outputs_into": {self.out_name: self.y_shm}}
            inputs = {self.name: self.x_shm}
        start = time.perf_counter_ns()
        reply = client.infer_reply(self.model, inputs, klass=KLASS, deadline_ms=DEADLINE_MS, **options)
        elapsed_us = (time.perf_counter_ns() - start) / 1000
        spec = reply.header["outputs"][0]
        if ("shm" in spec) != (path == "shm"):
            raise RuntimeError(f"{self.model} by {path}: the reply's output spec is {spec}")
        if count:
            self.samples[path].append(elapsed_us)
            timing = reply.header["timing_us"]
            self.daemon[path]["total"].append(timing["total"])
            self.daemon[path]["compute"].append(timing["compute"])
        return reply.outputs[self.out_name]

    def summary(self) -> dict[str, Any]:
        compute_p50 = float(np.median(self.samples["in_process"]))
        out: dict[str, Any] = {
            "rows": self.rows,
            "input_bytes": self.x.nbytes,
            "in_process": stats(self.samples["in_process"]),
        }
        for path in ("frames", "shm"):
            trips, computed = np.array(self.samples[path]), np.array(self.daemon[path]["compute"])
            out[path] = {
                "round_trip_us": stats(self.samples[path]),
                "daemon_total_us": stats(self.daemon[path]["total"]),
                "daemon_compute_us": stats(self.daemon[path]["compute"]),
                "overhead_vs_in_process_p50_us": round(float(np.median(trips)) - compute_p50, 1),
                "overhead_vs_own_compute_p50_us": round(float(np.median(trips - computed)), 1),
            }
        return out


class Echo:
    """The transport floor: a request-sized message (a header and the size's payload) echoed."""

    def __init__(self, endpoint: str, sizes: dict[str, int]) -> None:
        self.sock = dealer(endpoint)
        self.frames = {
            label: [bytes(f) for f in encode_request(1, model="echo", inputs={"x": np.zeros(n // 4, np.float32)})]
            for label, n in sizes.items()
        }
        self.samples: dict[str, list[float]] = {label: [] for label in sizes}

    def __call__(self, label: str, count: int) -> None:
        for _ in range(count):
            start = time.perf_counter_ns()
            self.sock.send_multipart(self.frames[label], copy=False)
            if not self.sock.poll(10_000):
                raise RuntimeError("no reply from the echo")
            self.sock.recv_multipart(copy=False)
            self.samples[label].append((time.perf_counter_ns() - start) / 1000)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="each heavy path is measured once a round")
    parser.add_argument("--light-per-round", type=int, default=3, help="light round trips per path and round")
    parser.add_argument("--echo-per-round", type=int, default=5, help="echo round trips per size and round")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sessions = {m: ort.InferenceSession(str(ROOT / "engines" / m / "model.onnx"), options) for m in MODELS}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="edged-shm-") as folder:
        config = Path(folder) / "edged.toml"
        config.write_text(CONFIG)
        endpoint, echo_endpoint = f"ipc://{folder}/edged.sock", f"ipc://{folder}/echo.sock"
        echo_server = helper_server("zmq_echo", echo_endpoint)
        try:
            with DaemonProcess([endpoint], config=config, log_path=Path(folder) / "daemon.log") as daemon:
                daemon.wait_serving()
                results = measure(endpoint, echo_endpoint, sessions, args)
        finally:
            echo_server.kill()
            echo_server.wait()
    results["seconds"] = round(time.monotonic() - started, 1)
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


def measure(endpoint: str, echo_endpoint: str, sessions: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    echo = Echo(echo_endpoint, SIZES)
    with Client(endpoint, timeout_ms=120_000) as client:
        # One region for every input and output; each view starts on a cache line.
        need = sum(n + rows_for(m, n) * 40 + 256 for n in SIZES.values() for m in MODELS)
        region = client.shared_region(need)
        try:
            summaries = rounds(client, region, echo, sessions, args)
            regions_held = client.stats()["shm"]
        finally:
            client.unregister(region)
            # rounds' views of the region are gone with its frame, unless a failure's
            # traceback holds them; the object is unlinked either way.
            with contextlib.suppress(BufferError):
                region.close()
        regions_after = client.stats()["shm"]
    echo.sock.close()
    return {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d")},
        "rounds": args.rounds,
        "class": KLASS,
        "echo_us": {label: stats(s) for label, s in echo.samples.items()},
        "models": summaries,
        "daemon_shm": {"while_measuring": regions_held, "after_unregister": regions_after},
    }


def rounds(
    client: Client, region: Any, echo: Echo, sessions: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """Warm every path, check the shm path's output is the frame path's, written in place,
    then the rounds; each cell's summary."""
    cells = {(label, model): Cell(model, n, region, sessions[model]) for label, n in SIZES.items() for model in MODELS}
    for cell in cells.values():
        for _ in range(WARMUP):
            cell.session.run(None, {cell.name: cell.x})
            framed = cell.through(client, "frames", count=False).copy()
            shared = cell.through(client, "shm", count=False)
        if not np.shares_memory(shared, cell.y_shm) or not np.allclose(framed, shared, rtol=1e-5, atol=1e-5):
            raise RuntimeError(f"{cell.model} at {cell.rows} rows: the shm output is not the frame's, in place")
    echo(next(iter(SIZES)), 5)
    steps: list[tuple[str, Any]] = []
    for (label, model), cell in cells.items():
        if model == next(iter(MODELS)):
            steps.append(("echo", label))
        steps += [(path, cell) for path in ("in_process", "frames", "shm")]
    for r in range(args.rounds):
        shift = (r * 5) % len(steps)
        for kind, what in steps[shift:] + steps[:shift]:
            if kind == "echo":
                echo(what, args.echo_per_round)
                continue
            for _ in range(args.light_per_round if what.model == "mlp-light" else 1):
                what.in_process() if kind == "in_process" else what.through(client, kind)
        sys.stderr.write(f"round {r + 1}/{args.rounds} done\n")
    return {f"{model} {label}": cell.summary() for (label, model), cell in cells.items()}


def report(results: dict[str, Any]) -> str:
    lines = ["echo (bare DEALER/ROUTER over ipc, the bytes both ways), round trip us:"]
    lines += [
        f"  {label}: p50 {s['p50']:.0f} / p99 {s['p99']:.0f} (n {s['n']})" for label, s in results["echo_us"].items()
    ]
    lines.append(
        "model size rows | in-process p50 | path: round trip p50 / p99 | daemon total / compute p50 | "
        "overhead vs in-process p50 | vs own compute p50 (ms)"
    )
    for key, cell in results["models"].items():
        ms = lambda us: us / 1000  # noqa: E731
        first = f"{key} {cell['rows']} rows | in-process {ms(cell['in_process']['p50']):.2f}"
        for path in ("frames", "shm"):
            p = cell[path]
            lines.append(
                f"{first} | {path}: {ms(p['round_trip_us']['p50']):.2f} / {ms(p['round_trip_us']['p99']):.2f} | "
                f"{ms(p['daemon_total_us']['p50']):.2f} / {ms(p['daemon_compute_us']['p50']):.2f} | "
                f"{ms(p['overhead_vs_in_process_p50_us']):.2f} | {ms(p['overhead_vs_own_compute_p50_us']):.2f}"
            )
            first = " " * len(first)
    lines.append(f"{results['seconds']} s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
