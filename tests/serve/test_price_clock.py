"""Prices by the CPU (edged.serve.pricing.price_clock): a call that computes on its own
thread alone is priced by that thread's CPU time, so the time it waits for a core (a
niced lane starved through a burst) shows in the lane's pace, never in the model's
price. Real sessions on the demo model; the starved call is a runner that sleeps."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from support.gpu import MLP

from edged.backends import computes_on_caller
from edged.backends.onnxruntime_cpu import OnnxRuntimeCpu
from edged.config.classes import ClassConfig
from edged.models.pipeline import Pipeline, Ref, Step, waves
from edged.serve.lanes.steps import Stepper
from edged.serve.pricing import ServiceTimes, price_clock

BULK = ClassConfig("bulk", order=2, nice=10, yields=True)
WAIT_S = 0.05  # what a starved call waits for a core: 25-37 ms were seen for a 2 ms call


class WaitingRunner:
    """A call that waits for a core, then computes a little: the shape of a starved one."""

    def __init__(self, on_caller: bool) -> None:
        self.computes_on_caller = on_caller

    def run(self, inputs: dict[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
        time.sleep(WAIT_S)
        return [inputs["x"] * 2]

    def close(self) -> None: ...


def test_the_cpu_backend_computes_on_the_callers_thread_only_in_a_lane_of_one_thread() -> None:
    backend = OnnxRuntimeCpu()
    one, pool = backend.load(MLP, BULK), backend.load(MLP, replace(BULK, threads=2))
    try:
        assert computes_on_caller(one) and price_clock(one) is time.thread_time_ns
        # A pool's threads compute beside the caller, whose CPU time would miss their work.
        assert not computes_on_caller(pool) and price_clock(pool) is time.perf_counter_ns
    finally:
        one.close()
        pool.close()


def test_a_pipeline_step_that_waits_for_a_core_is_priced_by_its_compute_alone() -> None:
    step = Step("double", (("x", Ref(None, "x")),), MLP.signature.outputs, frozenset(), "p/double", model=MLP)
    pipeline = Pipeline("p", waves("p", "test", {"double": step}), (("scores", Ref("double", "scores")),))
    x = np.ones((1, 64), np.float32)
    for on_caller, low_ms, high_ms in ((True, 0.0, 0.4 * WAIT_S * 1e3), (False, WAIT_S * 1e3, 10 * WAIT_S * 1e3)):
        service = ServiceTimes()
        Stepper({MLP.name: WaitingRunner(on_caller)}, service, 1).run(pipeline, {"x": x}, 1, 0)
        price_ms = service.prices()["p/double"]["first_row_ms"]
        assert low_ms <= price_ms < high_ms, (on_caller, price_ms)
