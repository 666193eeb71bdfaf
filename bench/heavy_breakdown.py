"""Where the worker path's round trip goes: edged beside the naive server, heavy model.

    python bench/heavy_breakdown.py [--rounds N] [--runs N]

Closed-loop round trips of `cnn-heavy` (realtime class, one raw DEALER per server),
interleaved in rotated rounds, timed in the client. Both servers time themselves and
say so in each reply (`timing_us`): queue (receipt to the backend call: decode,
admission and, in edged, the hand-off to the lane's worker), compute (the call) and
total (receipt to the result). What the client saw beyond `total` is `outside`: the
transport both ways, the wake-ups, the reply's encoding and send. The naive server is
compare.py's, timing itself as edged does.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import msgpack
import numpy as np
import zmq
from compare import MODELS, helper_server

from edged.launch import DaemonProcess
from edged.wire.codec import encode_request

PARTS = ("round_trip", "queue", "compute", "total", "outside")
WARMUP = 30


def round_trips(sock: zmq.Socket, frames: list[bytes], runs: int) -> dict[str, list[float]]:
    """`runs` round trips (after WARMUP), each with the server's own timing."""
    parts: dict[str, list[float]] = {part: [] for part in PARTS}
    for i in range(runs + WARMUP):
        start = time.perf_counter_ns()
        sock.send_multipart(frames)
        if not sock.poll(10_000):
            raise RuntimeError("no reply in 10 s")
        header = msgpack.unpackb(sock.recv_multipart()[0])
        elapsed_us = (time.perf_counter_ns() - start) / 1000
        if i < WARMUP:
            continue
        timing = header["timing_us"]
        parts["round_trip"].append(elapsed_us)
        for part in ("queue", "compute", "total"):
            parts[part].append(timing[part])
        parts["outside"].append(elapsed_us - timing["total"])
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runs", type=int, default=400, help="round trips per server and round")
    args = parser.parse_args()
    name, shape = MODELS["cnn-heavy"]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    frames = [bytes(f) for f in encode_request(1, model="cnn-heavy", klass="realtime", inputs={name: x})]
    with tempfile.TemporaryDirectory(prefix="edged-parts-") as folder:
        endpoints = {"naive_server": f"ipc://{folder}/naive.sock", "edged": f"ipc://{folder}/edged.sock"}
        naive = helper_server("naive_timed", endpoints["naive_server"])
        context = zmq.Context.instance()
        sockets = {path: context.socket(zmq.DEALER) for path in endpoints}
        try:
            with DaemonProcess([endpoints["edged"]]) as daemon:
                daemon.wait_serving()
                for path, sock in sockets.items():
                    sock.linger = 0
                    sock.connect(endpoints[path])
                measured: dict[str, dict[str, list[float]]] = {path: {p: [] for p in PARTS} for path in endpoints}
                for r in range(args.rounds):
                    for path in list(endpoints)[::-1] if r % 2 else endpoints:
                        for part, values in round_trips(sockets[path], frames, args.runs).items():
                            measured[path][part].extend(values)
        finally:
            for sock in sockets.values():
                sock.close()
            naive.kill()
    print(f"{'server':<13} {'part':<11} {'p50 us':>8} {'p90 us':>8} {'p99 us':>8}")
    for path, parts in measured.items():
        for part, values in parts.items():
            p50, p90, p99 = np.percentile(values, [50, 90, 99])
            print(f"{path:<13} {part:<11} {p50:>8.1f} {p90:>8.1f} {p99:>8.1f}")


if __name__ == "__main__":
    main()
