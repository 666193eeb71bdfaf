"""ONNX Runtime on its CPU provider: the embedded default, runs on any machine."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from edged.backends import CallStop
from edged.backends.int8_kernels import KernelCheck, check_int8_kernels
from edged.backends.shared_sessions import SESSIONS, Key, session_key
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry

log = logging.getLogger("edged")


def cpu_session(
    path: Path, precision: str, *, fused: bool = True, threads: int = 1, quiet: bool = False
) -> ort.InferenceSession:
    """A CPU session for a model file of `precision`.

    `fused=False` runs a Q/DQ graph as written, each DequantizeLinear and then the float
    op, instead of fusing it into this CPU's integer kernels: the graph's own math, which
    is what TensorRT computes from the same file (it accumulates INT8 products in 32 bits).
    `quiet` logs nothing, not even a failed call: for `edged import`, whose tries of sizes
    a model refuses are expected, each of which would print ONNX Runtime's error log.
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
    # Spinning pool threads would burn the cores that other lanes need.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 4 if quiet else 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxRuntimeCpuRunner:
    """A runner on the process's one session for its model and settings (SESSIONS)."""

    def __init__(self, model: ModelEntry, lane: ClassConfig, fused: bool = True) -> None:
        path, precision, threads = model.variant.path, model.variant.precision, lane.threads
        # A session with a pool of its own (threads != 1) is shared within its lane only.
        owner = None if threads == 1 else lane.name
        self._key: Key | None = session_key(path, precision, fused, threads, owner)
        self._session = SESSIONS.take(self._key, lambda: cpu_session(path, precision, fused=fused, threads=threads))

    def run(
        self, inputs: dict[str, np.ndarray], output_names: Sequence[str], stop: CallStop | None = None
    ) -> list[np.ndarray]:
        if stop is None:
            return self._session.run(list(output_names), inputs)
        options = ort.RunOptions()
        # ONNX Runtime reads the flag between nodes: the call raises within one node's time.
        stop.bind(lambda: setattr(options, "terminate", True))
        return self._session.run(list(output_names), inputs, options)

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
        fused = model.variant.precision != "int8" or self._check(model).fused
        return OnnxRuntimeCpuRunner(model, lane, fused)

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
