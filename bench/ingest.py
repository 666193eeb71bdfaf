"""Where a loop's time goes per message in a burst: one bulk cnn-heavy request
(48 KiB) handled by the real dispatcher and lanes, in this process, with no socket.

    python bench/ingest.py [--messages 5000]

Three cases, each timed over `--messages` handlings: a request shed because bulk's
queue is full (the lane's backend held, so nothing drains), one shed because its
deadline cannot be met, and one admitted and queued. Beside each whole handling, its
steps: decoding the header and viewing the payload, binding it to the model's
signature (from the header: a shed request's payload is never looked at), the lane's
admission, and encoding the OVERLOADED reply.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from edged.backends.onnxruntime_cpu import OnnxRuntimeCpu
from edged.backends.shared import MemoryPlan
from edged.config import load_config
from edged.daemon.lifecycle import Lifecycle, State
from edged.daemon.loading import Loaded
from edged.models.repository import discover
from edged.serve.dispatch import Dispatcher, Serving
from edged.serve.lanes.lane import Lane
from edged.serve.pending import PendingBytes
from edged.shm.registry import Regions
from edged.wire import fast
from edged.wire.codec import encode_request

IMAGE = np.random.default_rng(0).standard_normal((1, 3, 64, 64), dtype=np.float32)


class Held:
    """The CPU backend, with every call held until `release`: a lane that never drains."""

    def __init__(self) -> None:
        self._real = OnnxRuntimeCpu()
        self.gate = threading.Event()
        self.gate.set()

    def load(self, model: Any, lane: Any) -> Any:
        runner = self._real.load(model, lane)
        gate = self.gate

        class Runner:
            def run(self, inputs: Any, output_names: Any) -> Any:
                gate.wait()
                return runner.run(inputs, output_names)

            def close(self) -> None:
                runner.close()

        return Runner()


class Sink:
    """Stands in for the loop that owns bulk's socket: replies are counted and dropped."""

    def __init__(self) -> None:
        self.replies = 0
        self.bound = [SimpleNamespace(klass="bulk", local=True, peer_prefix=b"ingest\0")]
        self.handoff_ns = 0.0  # nothing runs inline: bulk waits to fill batches anyway

    def send(self, route: Any, frames: Any) -> None:
        self.replies += 1


def per_call_us(work: Callable[[int], None], count: int) -> float:
    start = time.perf_counter_ns()
    for i in range(count):
        work(i)
    return (time.perf_counter_ns() - start) / count / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    args = parser.parse_args()
    config = load_config(None)
    models = [m for m in discover(config.model_repository, "onnxruntime") if m.name == "cnn-heavy"]
    backend, sink = Held(), Sink()
    lifecycle = Lifecycle()
    serving = Serving(config, lifecycle, Regions(config.shm), PendingBytes(config.limits), {}, lambda: None)
    dispatcher = Dispatcher("bulk", serving)
    serving.dispatchers["bulk"] = dispatcher
    dispatcher.loop = sink  # type: ignore[assignment]
    lanes = {c.name: Lane(c, models, backend) for c in config.classes}
    for lane in lanes.values():
        lane.start()
    dispatcher.take_up(Loaded(config, models, lanes, {}, MemoryPlan(), False, 0.0, {}), 1)
    lifecycle.move(State.SERVING)
    limits = config.limits
    route = (sink, 0, [SimpleNamespace(bytes=b"bench")])

    def frames(deadline_ms: float) -> list[bytes]:
        request = encode_request(1, model="cnn-heavy", klass="bulk", deadline_ms=deadline_ms, inputs={"image": IMAGE})
        return [bytes(f) for f in request]

    # An hour (the longest deadline there is): with its backend held, the lane answers
    # nothing, and a bulk lane's admission, which watches its pace, would shed anything
    # shorter before the queue filled.
    fits, too_short = frames(3_600_000.0), frames(0.01)
    bulk = lanes["bulk"]
    figures: dict[str, float] = {}
    try:
        backend.gate.clear()
        # Admitted and queued, up to the queue's capacity (measured on the first ones).
        queued = min(args.messages, bulk.klass.queue_capacity - 1)
        figures["admitted and queued"] = per_call_us(
            lambda i: dispatcher.handle(route, fits, time.monotonic_ns()), queued
        )
        while bulk.backlog.depth < bulk.klass.queue_capacity:
            dispatcher.handle(route, fits, time.monotonic_ns())
        figures["shed: queue full"] = per_call_us(
            lambda i: dispatcher.handle(route, fits, time.monotonic_ns()), args.messages
        )
        figures["shed: deadline"] = per_call_us(
            lambda i: dispatcher.handle(route, too_short, time.monotonic_ns()), args.messages
        )
        model = models[0]
        request = fast.decode_request(fits, limits)
        assert request is not None
        figures["  step: decode the header"] = per_call_us(lambda i: fast.decode_request(fits, limits), args.messages)
        figures["  step: check it against the signature"] = per_call_us(
            lambda i: model.signature.check(request), args.messages
        )
        figures["  step: the lane's offer (a shed)"] = per_call_us(
            lambda i: bulk.offer(route, request, model, 1, 0, time.monotonic_ns()), args.messages
        )
        message = "class 'bulk' has 512 requests waiting or running, its capacity; retry after about 1500.0 ms"
        figures["  step: encode the OVERLOADED reply"] = per_call_us(
            lambda i: fast.encode_overloaded(1, message, 1500.0, 12), args.messages
        )
    finally:
        backend.gate.set()
        for lane in lanes.values():
            lane.crew.reject_queued("the benchmark is over")
            lane.crew.stop(5.0)
    width = max(map(len, figures))
    print(f"per message, us (mean of {args.messages}; cnn-heavy, 48 KiB, class bulk):")
    for name, us in figures.items():
        print(f"{name:<{width}} {us:8.2f}")
    print(f"replies: {sink.replies}; median step: {statistics.median(figures.values()):.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
