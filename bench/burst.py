"""A pipelined burst: how much of what admission lets in then expires.

    python bench/burst.py [--requests 500] [--runs 5] [--model cnn-heavy] [--klass standard]

Each run starts a fresh daemon (the built-in config), sends every request at once on
one DEALER socket, and counts the replies. A request that is admitted and then
expires in the queue (DEADLINE_EXCEEDED) is a promise admission could not keep; the
target is at most 1% of the admitted.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter

import msgpack
import numpy as np
import zmq

from edged.loadgen.launch import DaemonProcess
from edged.protocol import encode_request

SHAPES = {"cnn-heavy": ("image", (3, 64, 64)), "mlp-light": ("x", (64,))}


def burst(endpoint: str, model: str, klass: str, requests: int) -> Counter[str]:
    name, shape = SHAPES[model]
    inputs = {name: np.random.default_rng(0).standard_normal((1, *shape), dtype=np.float32)}
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.sndhwm = sock.rcvhwm = 0
    sock.linger = 0
    sock.connect(endpoint)
    try:
        for i in range(requests):
            sock.send_multipart(encode_request(i, model=model, klass=klass, inputs=inputs), copy=False)
        statuses: Counter[str] = Counter()
        for _ in range(requests):
            if not sock.poll(30_000):
                raise SystemExit(f"no reply within 30 s after {sum(statuses.values())} replies")
            statuses[msgpack.unpackb(sock.recv_multipart()[0])["status"]] += 1
        return statuses
    finally:
        sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--model", choices=sorted(SHAPES), default="cnn-heavy")
    parser.add_argument("--klass", default="standard")
    args = parser.parse_args()
    totals: Counter[str] = Counter()
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="edged-burst-") as folder:
            endpoint = f"ipc://{folder}/edged.sock"
            with DaemonProcess([endpoint]) as daemon:
                daemon.wait_serving()
                statuses = burst(endpoint, args.model, args.klass, args.requests)
        admitted = statuses["OK"] + statuses["DEADLINE_EXCEEDED"]
        print(f"run {run + 1}: {dict(statuses)}; expired {statuses['DEADLINE_EXCEEDED']} of {admitted} admitted")
        totals.update(statuses)
    admitted = totals["OK"] + totals["DEADLINE_EXCEEDED"]
    share = totals["DEADLINE_EXCEEDED"] / admitted if admitted else 0.0
    print(f"all runs: {dict(totals)}; expired {share:.2%} of the admitted (target: at most 1%)")


if __name__ == "__main__":
    main()
