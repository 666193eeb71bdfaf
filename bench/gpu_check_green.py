"""bench/gpu_checks.py green: ONNX Runtime on a green context's stream agrees with the CPU (see there).
Ran on an NVIDIA H200 and an NVIDIA H100 (2026-11-27; docs/benchmarks-gpu.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_checks import CpuReference, agreement, model_named, random_inputs, write

from edged.config import ClassConfig
from edged.loadgen.gpu_scenarios import BULK_SMS
from edged.models.repository import ModelEntry

SIZES = (1, 5, 16)  # rows: the smallest, an odd one, bulk's max_batch


def compare(runner: Any, model: ModelEntry, cpu: Any, sizes: tuple[int, ...] = SIZES) -> list[dict[str, Any]]:
    """`runner`'s outputs against the CPU's at each batch size, each within the TF32 bound or not."""
    results = []
    for rows in sizes:
        inputs = random_inputs(model, rows, seed=rows)
        try:
            got = runner.run(inputs, list(model.signature.output_names))
        except Exception as exc:  # a failure of the green stream is what this check looks for
            results.append({"rows": rows, "ok": False, "error": repr(exc)})
            continue
        agreed = agreement(model, got, cpu.run(model, inputs))
        results.append({"rows": rows, "ok": agreed["max_error"] <= agreed["bound"], **agreed})
    return results


def run(out: Path) -> int:
    from edged.backends.onnxruntime_cuda import OnnxRuntimeCuda

    model, backend = model_named("cnn-heavy"), OnnxRuntimeCuda()
    klass = ClassConfig("bulk", order=2, max_batch=max(SIZES), sm_count=BULK_SMS, arena_cap_mb=1024)
    backend.reserve([model], [klass], backend.free_bytes())
    runner = backend.load(model, klass)
    try:
        results = compare(runner, model, CpuReference())
    finally:
        runner.close()
    outcome = "PASS" if all(result["ok"] for result in results) else "FAIL"
    record = {"device": backend.device_name, "model": model.name, "sm_count": BULK_SMS, "runs": results}
    write(out, "green", record | {"cpu_nodes": runner.cpu_nodes, "outcome": outcome})
    for result in results:
        print(result)
    if not all(result["ok"] for result in results):
        print(f"green: FAIL: {model.name} on a green context of {BULK_SMS} SMs differs from the CPU (see above)")
        return 1
    print(f"green: PASS: {model.name} (cuDNN) on a green context of {BULK_SMS} SMs equals the CPU at {SIZES} rows")
    return 0
