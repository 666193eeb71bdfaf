"""Whether this CPU's fused INT8 kernels compute a Q/DQ model's own math.

By default ONNX Runtime fuses a Q/DQ graph into integer kernels (u8 x s8). On x86
without VNNI they multiply and add pairs of bytes with VPMADDUBSW, whose 16-bit sums
saturate: there the demo MLP's INT8 variant agrees with FP32 to a worst cosine of 0.982
instead of the 0.9987 its Q/DQ graph reaches (an AMD EPYC with AVX2 and no VNNI, and the
same under `qemu-x86_64 -cpu EPYC-Milan`). VNNI sums in 32 bits, as TensorRT does.

The backend does not guess from CPU flags (qemu reports the host's in /proc/cpuinfo, and
a hypervisor may hide VNNI from CPUID): it measures, once per model and load, the fused
session against the unfused one on the same random inputs, and times each. Where they
disagree, the lanes serve the graph unfused: what the quantizer checked, at the unfused
speed, which the log line gives beside the fused one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edged.models.accuracy import compare
from edged.models.repository import ModelEntry

# The fused kernels agree when their worst row is this close to the graph's math. Where
# they sum in 32 bits the two differ by float rounding at most (bit for bit the same on
# the demo MLP); a saturated sum moves a row by far more (0.984 on the demo MLP).
AGREES = 0.9999
PROBE_ROWS = 16  # rows compared, where the first dimension is dynamic
TIMED_CALLS = 5


@dataclass(frozen=True, slots=True)
class KernelCheck:
    """How this CPU's fused INT8 kernels compare with the Q/DQ graph run unfused."""

    fused: bool  # whether the lanes serve the fused kernels: only where they compute the graph's math
    cosine_min: float  # fused against unfused, the worst row of the probe
    max_abs_error: float
    fused_ms: float  # median of TIMED_CALLS calls on one row
    unfused_ms: float

    def to_wire(self) -> dict[str, Any]:
        return {
            "kernels": "fused" if self.fused else "unfused",
            "fused_cosine_min": round(self.cosine_min, 6),
            "fused_max_abs_error": round(self.max_abs_error, 6),
            "fused_ms": round(self.fused_ms, 3),
            "unfused_ms": round(self.unfused_ms, 3),
        }

    def describe(self, model: str) -> str:
        figures = (
            f"worst cosine {self.cosine_min:.5f}, max abs error {self.max_abs_error:.4f} against the Q/DQ graph; "
            f"{self.fused_ms:.3f} ms a call fused, {self.unfused_ms:.3f} ms unfused"
        )
        if self.fused:
            return f"{model}: this CPU's fused INT8 kernels compute the model's Q/DQ math ({figures}): serving fused"
        return (
            f"{model}: this CPU's fused INT8 kernels do NOT compute the model's Q/DQ math, most likely because "
            f"without VNNI their 16-bit sums saturate ({figures}): serving the Q/DQ graph unfused, as it was "
            "checked when quantized"
        )


def probe_inputs(model: ModelEntry, rows: int) -> dict[str, np.ndarray]:
    """Seeded N(0, 1) floats at the model's first warm-up sample's shapes, with `rows` rows
    where the first dimension is dynamic; other dtypes keep the sample's own values."""
    rng = np.random.default_rng(0)
    specs = {spec.name: spec for spec in model.signature.inputs}
    probe = {}
    for name, array in model.samples[0].inputs().items():
        shape = (rows, *array.shape[1:]) if tuple(specs[name].shape[:1]) == (-1,) else array.shape
        if np.issubdtype(array.dtype, np.floating):
            probe[name] = rng.standard_normal(shape).astype(array.dtype)
        else:
            probe[name] = np.resize(array, shape)  # the sample's own values, repeated
    return probe


def check_int8_kernels(model: ModelEntry, session: Callable[[bool], Any]) -> KernelCheck:
    """Compare `model` fused and unfused (`session(fused)` opens each) on PROBE_ROWS rows,
    and time each on one."""
    fused, unfused = session(True), session(False)
    output = [model.signature.outputs[0].name]
    probe = probe_inputs(model, PROBE_ROWS)
    accuracy = compare(unfused.run(output, probe)[0], fused.run(output, probe)[0])
    one = probe_inputs(model, 1)
    return KernelCheck(
        fused=accuracy.cosine_min >= AGREES,
        cosine_min=accuracy.cosine_min,
        max_abs_error=accuracy.max_abs_error,
        fused_ms=_median_ms(lambda: fused.run(output, one)),
        unfused_ms=_median_ms(lambda: unfused.run(output, one)),
    )


def _median_ms(call: Callable[[], object]) -> float:
    call()  # the first call at a shape allocates: not timed
    times = []
    for _ in range(TIMED_CALLS):
        started = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - started)
    return sorted(times)[len(times) // 2] / 1e6
