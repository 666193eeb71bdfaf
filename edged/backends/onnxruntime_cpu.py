"""ONNX Runtime on its CPU provider: the embedded default, runs on any machine.

One session per model file and session settings, shared by every runner in the process
that asks for the same (edged.backends.shared): a model's weights, packed, held once.
A session per runner held a copy per worker per class, plus the inline path's: four or
more times the model (bench/weights_sharing.py, 2026-11-25: 786 MiB for four runners of a 192 MiB
model; one session called from four threads, 202). Shared initializers
(`SessionOptions.add_initializer`) save nothing here: MatMul pre-packs its weights, and
each session keeps its own packed copy, since the Python API has no pre-packed weights
container. ONNX Runtime's `run` may be called from several threads at once, and with
one intra-op thread a call computes on its caller's thread, so each lane's niceness
and cores still apply to its own calls. A session with a pool of its own is shared
only within one lane: its pool threads take the settings of the thread that made them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from edged.backends.host_memory import trim
from edged.backends.int8_kernels import KernelCheck, check_int8_kernels
from edged.backends.shared import Key, Shared, Weights, WeightsHold, file_key
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry
from edged.models.warmup import load_failure

log = logging.getLogger("edged")

SESSIONS: Shared[ort.InferenceSession] = Shared()  # the process's: a reload's backend finds the old sessions


def cpu_session(
    path: Path, precision: str, *, fused: bool = True, threads: int = 1, spin: bool = False, quiet: bool = False
) -> ort.InferenceSession:
    """A CPU session for a model file of `precision`.

    `fused=False` runs a Q/DQ graph as written, each DequantizeLinear and then the float
    op, instead of fusing it into this CPU's integer kernels: the graph's own math, which
    is what TensorRT computes from the same file (it accumulates INT8 products in 32 bits).
    `quiet` logs nothing, not even a failed call: for `edged import`, whose tries of sizes
    a model refuses are expected, each of which would print ONNX Runtime's error log.
    `spin` (with a pool: `threads` other than 1) lets the pool's threads spin between the
    pieces of a call, as ONNX Runtime does by default, and stop when the call ends.
    """
    options = ort.SessionOptions()
    # threads=1 runs the graph on the calling thread, so a lane's niceness and core
    # pinning apply to the compute itself.
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if precision == "fp8":
        # The CPU provider has no fused float8 kernels: at the higher levels it fuses
        # FP8 Q/DQ pairs into QGemm/QLinearConv, which then fail to load. At the basic
        # level it runs them as separate ops: correct and slow, for accuracy checks.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if not fused:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    # A pool that sleeps between the pieces of a call is woken through the kernel for
    # each of them, and a call is slower than in-process (docs/engines.md, "Threads").
    # Spinning keeps pace where the pool has its cores to itself, and on a busy box holds
    # the core the thread it waits for needs: so a lane spins by default only on cores of
    # its own (edged.config.classes.resolve_spin). Stopped when the last call returns, the
    # pool burns nothing between calls (without the stop, 16 ms of CPU in the half second
    # after a cnn-heavy call), so the other classes pay only while this lane computes.
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if spin:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    options.log_severity_level = 4 if quiet else 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def session_key(model: ModelEntry, lane: ClassConfig, fused: bool) -> Key:
    """The key of the session `lane` runs `model` on. A session with a pool of its own
    (threads != 1) is shared within its lane only."""
    owner = None if lane.threads == 1 else lane.name
    return file_key(model.variant.path, model.variant.precision, fused, lane.threads, lane_spins(lane), owner)


def lane_spins(lane: ClassConfig) -> bool:
    """Whether `lane`'s sessions have a pool, and it spins (`classes.NAME.threads_spin`)."""
    return lane.threads != 1 and bool(lane.threads_spin)


def lane_session(model: ModelEntry, lane: ClassConfig, fused: bool) -> ort.InferenceSession:
    path, precision = model.variant.path, model.variant.precision
    return cpu_session(path, precision, fused=fused, threads=lane.threads, spin=lane_spins(lane))


class OnnxRuntimeCpuRunner:
    """A runner on the process's one session for its model and settings (SESSIONS)."""

    def __init__(self, model: ModelEntry, lane: ClassConfig, fused: bool = True) -> None:
        self._key: Key | None = session_key(model, lane, fused)
        self._session = SESSIONS.take(self._key, lambda: lane_session(model, lane, fused))
        # With one intra-op thread the graph runs on the caller's thread (see cpu_session).
        self.computes_on_caller = lane.threads == 1

    def run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        return self._session.run(list(output_names), inputs)

    def close(self) -> None:
        """Give the session back, once (a second close is a no-op)."""
        if self._key is not None:
            del self._session
            SESSIONS.give_back(self._key)
            self._key = None


class OnnxRuntimeCpu:
    """Loads each lane's session. An INT8 variant is first checked, once per model and
    load, for whether this CPU's fused kernels compute its Q/DQ graph's math (see
    edged.backends.int8_kernels); where they do not, every lane runs the graph unfused."""

    def __init__(self) -> None:
        self._checks: dict[str, KernelCheck] = {}
        self._lock = threading.Lock()  # lanes load on their own workers' threads

    def load(self, model: ModelEntry, lane: ClassConfig) -> OnnxRuntimeCpuRunner:
        return OnnxRuntimeCpuRunner(model, lane, self._fused(model))

    def weights_plan(self, model: ModelEntry, classes: Sequence[ClassConfig]) -> Weights:
        keys = self._sessions_of(model, classes)
        new = sum(not SESSIONS.holds(key) for key in keys)
        # Any key of the file counts every session of its earlier versions.
        draining = SESSIONS.replaced(next(iter(keys))) if keys else 0
        return Weights(model.name, len(keys), new, model.variant.path.stat().st_size, draining=draining)

    def hold_weights(self, model: ModelEntry, classes: Sequence[ClassConfig]) -> WeightsHold:
        plan = self.weights_plan(model, classes)
        taken: list[Key] = []

        def release() -> None:
            for key in taken:
                SESSIONS.give_back(key)

        before = trim()
        try:
            for key, lane in self._sessions_of(model, classes).items():
                SESSIONS.take(key, lambda lane=lane: lane_session(model, lane, self._fused(model)))
                taken.append(key)
        except Exception as exc:
            release()
            raise load_failure(model.name, model.variant.path, exc) from exc
        return WeightsHold(replace(plan, added_bytes=max(0, trim() - before)), release)

    def _sessions_of(self, model: ModelEntry, classes: Sequence[ClassConfig]) -> dict[Key, ClassConfig]:
        """The distinct sessions `classes`' lanes run `model` on, each with the first lane to need it."""
        fused = self._fused(model)
        sessions: dict[Key, ClassConfig] = {}
        for lane in classes:
            sessions.setdefault(session_key(model, lane, fused), lane)
        return sessions

    def _fused(self, model: ModelEntry) -> bool:
        return model.variant.precision != "int8" or self._check(model).fused

    def describe(self, model: ModelEntry) -> dict[str, Any]:
        check = self._checks.get(model.name)
        return {} if check is None else {"cpu_int8": check.to_wire()}

    def _check(self, model: ModelEntry) -> KernelCheck:
        with self._lock:
            if model.name not in self._checks:
                check = check_int8_kernels(model, lambda fused: cpu_session(model.variant.path, "int8", fused=fused))
                log.log(logging.INFO if check.fused else logging.WARNING, "%s", check.describe(model.name))
                self._checks[model.name] = check
            return self._checks[model.name]
