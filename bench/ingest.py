"""Where the socket loop's time goes per message in a burst: one bulk cnn-heavy
request (48 KiB) handled by the real dispatcher and lanes, in this process, with no
socket.

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
from typing import Any

import numpy as np

from edged.backends.onnxruntime_cpu import OnnxRuntimeCpu
from edged.backends.shared import MemoryPlan
from edged.config import load_config
from edged.daemon.lifecycle import Lifecycle, State
from edged.models.repository import discover
from edged.serve.dispatch import Dispatcher
from edged.serve.lanes.lane import Lane
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
            def run(self, inputs: Any, output_names: Any, stop: Any = None) -> Any:
                gate.wait()
                return runner.run(inputs, output_names, stop)

            def close(self) -> None:
                runner.close()

        return Runner()


class Sink:
    """A Transport with no sockets: replies are counted and dropped."""

    unroutable = 0

    def __init__(self) -> None:
        self.replies = 0
        self.ingress: dict[str, list[str]] = {}

    def reply(self, route: Any, frames: Any) -> None:
        self.replies += 1

    def peer(self, route: Any) -> bytes:
        return b"bench"

    def wake(self) -> None:
        """Nothing to wake."""

    def ask(self, question: Callable[[], Any], timeout_s: float) -> Any:
        return question()

    def run_aside(self, call: Callable[[], None]) -> bool:
        return False


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
    dispatcher = Dispatcher(config, sink, lifecycle)
    lanes = {c.name: Lane(c, models, backend, sink) for c in config.classes}
    for lane in lanes.values():
        lane.start()
    dispatcher.serve(config, models, lanes, {}, MemoryPlan(), False, {})
    lifecycle.move(State.SERVING)
    limits = config.limits

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
            lambda i: dispatcher.handle(None, fits, time.monotonic_ns(), None), queued
        )
        while bulk.backlog.depth < bulk.klass.queue_capacity:
            dispatcher.handle(None, fits, time.monotonic_ns(), None)
        figures["shed: queue full"] = per_call_us(
            lambda i: dispatcher.handle(None, fits, time.monotonic_ns(), None), args.messages
        )
        figures["shed: deadline"] = per_call_us(
            lambda i: dispatcher.handle(None, too_short, time.monotonic_ns(), None), args.messages
        )
        model = models[0]
        request = fast.decode_request(fits, limits)
        assert request is not None
        figures["  step: decode the header"] = per_call_us(lambda i: fast.decode_request(fits, limits), args.messages)
        figures["  step: check it against the signature"] = per_call_us(
            lambda i: model.signature.check(request), args.messages
        )
        figures["  step: the lane's offer (a shed)"] = per_call_us(
            lambda i: bulk.offer(None, request, model, 1, 0, time.monotonic_ns()), args.messages
        )
        message = "class 'bulk' has 512 requests waiting or running, its capacity; retry after about 1500.0 ms"
        figures["  step: encode the OVERLOADED reply"] = per_call_us(
            lambda i: fast.encode_overloaded(1, message, 1500.0, 12), args.messages
        )
    finally:
        backend.gate.set()
        for lane in lanes.values():
            lane.reject_queued("the benchmark is over")
            lane.stop(5.0)
    width = max(map(len, figures))
    print(f"per message, us (mean of {args.messages}; cnn-heavy, 48 KiB, class bulk):")
    for name, us in figures.items():
        print(f"{name:<{width}} {us:8.2f}")
    print(f"replies: {sink.replies}; median step: {statistics.median(figures.values()):.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
