"""What each step of a light request's serving decisions costs alone, warm, in this process.

    python bench/decision_steps.py [--calls 20000]

Each step the loop takes for an inline mlp-light request, called in a tight loop on the
objects the daemon uses (the model's entry from engines/, a lane's prices, backlog,
figures and pending bytes): the best of 5 repeats, in us a call. A floor for each step:
in the daemon the loop reaches them cold, after a sleep in zmq_poll, and they cost more
(bench/bare_loop.py measures the whole; bench/hot_path.py each step in place).
"""

from __future__ import annotations

import argparse
import time
import timeit
from collections.abc import Callable
from typing import Any

import numpy as np
from paths import ROOT

from edged.config.classes import ClassConfig
from edged.models.repository import discover
from edged.serve.admission import Backlog, Outlook, admit
from edged.serve.pending import PendingBytes
from edged.serve.pricing import ServiceTimes
from edged.serve.stats import ClassStats
from edged.wire import fast
from edged.wire.codec import Limits, encode_request, tensor_views

MODEL = "mlp-light"
CALL_NS = 30_000


def steps() -> dict[str, Callable[[], Any]]:
    """Each step, ready to call, in the order a request meets them."""
    model = next(entry for entry in discover(ROOT / "engines", "onnxruntime") if entry.name == MODEL)
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    frames = [memoryview(bytes(frame)) for frame in encode_request(1, model=MODEL, inputs={"x": x})]
    limits = Limits()
    request = fast.decode_request(frames, limits)
    assert request is not None
    klass = ClassConfig(name="standard", order=1)
    stats, backlog, service, pending = ClassStats(), Backlog(), ServiceTimes(), PendingBytes()
    service.observe(MODEL, CALL_NS, 1)
    outputs = {"out": np.zeros((1, 10), np.float32)}

    def backlog_add_finish() -> None:
        backlog.add(CALL_NS)
        backlog.finish(CALL_NS)

    def pending_take_give_back() -> None:
        pending.take(b"peer", 256, backlog)
        pending.give_back(b"peer", 256)

    return {
        "decode (the fast decoder)": lambda: fast.decode_request(frames, limits),
        "the signature's check": lambda: model.signature.check(request),
        "the signature's measure": lambda: model.signature.measure(request),
        "the price (charge_ns)": lambda: service.charge_ns(MODEL, 1, 0),
        "the lane's outlook": lambda: backlog.outlook(time.monotonic_ns(), (0, 0), True),
        "admission (admit)": lambda: admit(klass, backlog, CALL_NS, 10**9, 0, Outlook(1.0), 0),
        "pending bytes, take and give back": pending_take_give_back,
        "the tensors' views": lambda: tensor_views(request),
        "the backlog, add and finish": backlog_add_finish,
        "the run's figures (stats.call)": lambda: stats.call(1),
        "a CPU-clock read (the price's clock)": time.thread_time_ns,
        "encode (the fast encoder)": lambda: fast.encode_ok(1, 1, 30, 100, outputs),
        "the answer's figures (stats.done)": lambda: stats.done(True, 1, 30, 100, False),
        "the price's update (observe)": lambda: service.observe(MODEL, CALL_NS, 1, 0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls of each step in each of 5 repeats")
    args = parser.parse_args()
    for label, step in steps().items():
        best_s = min(timeit.repeat(step, number=args.calls, repeat=5))
        print(f"{label:40} {best_s / args.calls * 1e6:6.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
