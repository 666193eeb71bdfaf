"""A lane's pool of ONNX Runtime threads (`classes.NAME.threads`): it spins while a call
computes, as an in-process session's does, and burns nothing between calls. Real
sessions on cnn-heavy, in this process; bench/threads.py measures what it buys."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest
from support import ENGINES

from edged.backends.onnxruntime_cpu import OnnxRuntimeCpu, OnnxRuntimeCpuRunner
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry, entries_of

BULK = ClassConfig("bulk", order=2, threads=2, threads_spin=True)
IMAGE = np.random.default_rng(3).standard_normal((1, 3, 64, 64)).astype(np.float32)


@pytest.fixture
def cnn() -> ModelEntry:
    return entries_of(ENGINES / "cnn-heavy" / "manifest.json", "onnxruntime")[0]


def spins(runner: OnnxRuntimeCpuRunner) -> str:
    options = runner._session.get_session_options()
    return options.get_session_config_entry("session.intra_op.allow_spinning")


def idle_cpu_ms(runner: OnnxRuntimeCpuRunner) -> float:
    """The process's CPU time in the half second after a call (the pool's spinning, if any)."""
    runner.run({"image": IMAGE}, ["logits"])
    start = time.process_time()
    time.sleep(0.5)
    return (time.process_time() - start) * 1e3


def test_a_lane_with_a_pool_spins_in_its_calls_and_burns_nothing_between_them(cnn: ModelEntry) -> None:
    runner = OnnxRuntimeCpu().load(cnn, BULK)
    try:
        assert spins(runner) == "1"
        # Spinning without the stop at the call's end burned 16 ms here (a quiet box).
        idle = min(idle_cpu_ms(runner) for _ in range(3))
        assert idle < 4, f"{idle:.1f} ms of CPU while no call ran"
    finally:
        runner.close()


def test_threads_spin_false_or_left_out_and_one_thread_never_spin(cnn: ModelEntry) -> None:
    backend = OnnxRuntimeCpu()
    for lane in (replace(BULK, threads_spin=False), replace(BULK, threads_spin=None), replace(BULK, threads=1)):
        runner = backend.load(cnn, lane)
        try:
            assert spins(runner) == "0", lane
        finally:
            runner.close()
