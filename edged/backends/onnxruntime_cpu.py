"""ONNX Runtime on its CPU provider: the embedded default, runs on any machine."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from edged.backends import CallStop
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry


class OnnxRuntimeCpuRunner:
    def __init__(self, model: ModelEntry, lane: ClassConfig) -> None:
        options = ort.SessionOptions()
        # threads=1 runs the graph on the lane's own worker thread, so the lane's
        # niceness and core pinning apply to the compute itself.
        options.intra_op_num_threads = lane.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if model.variant.precision == "fp8":
            # The CPU provider has no fused float8 kernels: at the higher levels it fuses
            # FP8 Q/DQ pairs into QGemm/QLinearConv, which then fail to load. At the basic
            # level it runs them as separate ops: correct and slow, for accuracy checks.
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        # Spinning pool threads would burn the cores that other lanes need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        self._session = ort.InferenceSession(str(model.variant.path), options, providers=["CPUExecutionProvider"])

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
        del self._session


class OnnxRuntimeCpu:
    def load(self, model: ModelEntry, lane: ClassConfig) -> OnnxRuntimeCpuRunner:
        return OnnxRuntimeCpuRunner(model, lane)
