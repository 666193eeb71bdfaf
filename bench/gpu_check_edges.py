"""bench/gpu_checks.py edges: a kept output is the runner's own device buffer, holding what `run`
downloads (see there). Ran on an NVIDIA H200 and an NVIDIA H100 (2026-11-27; docs/benchmarks-gpu.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gpu_checks import CpuReference, agreement, model_named, random_inputs, write

from edged.backends import DeviceTensor, cuda
from edged.config import ClassConfig

ROWS = 2


def stale(tensor: DeviceTensor | np.ndarray) -> bool:
    """Whether `tensor`'s pointer is still handed out (it must not be, once its runner ran again)."""
    try:
        return bool(tensor.pointer) if isinstance(tensor, DeviceTensor) else False
    except cuda.CudaError:
        return False


def run(out: Path) -> int:
    from edged.backends.onnxruntime_cuda import OnnxRuntimeCuda

    model, backend = model_named("mlp-light"), OnnxRuntimeCuda()
    klass = ClassConfig("realtime", order=0, max_batch=ROWS)
    backend.reserve([model], [klass], backend.free_bytes())
    runner = backend.load(model, klass)
    names = list(model.signature.output_names)
    inputs = random_inputs(model, ROWS, seed=7)
    try:
        downloaded = runner.run(inputs, names)
        kept = runner.run_keeping(dict(inputs), names, set(names))
        read = [cuda.download_now(t) if isinstance(t, DeviceTensor) else t for t in kept]
        lent = all(isinstance(t, DeviceTensor) for t in kept)
        same = lent and all(np.array_equal(r, d) for r, d in zip(read, downloaded, strict=True))
        agreed = agreement(model, read, CpuReference().run(model, inputs))
        runner.run(random_inputs(model, ROWS, seed=8), names)
        refused = lent and not any(stale(t) for t in kept)  # its buffer holds that call's output now
    finally:
        runner.close()
    ok = same and agreed["max_error"] <= agreed["bound"] and refused
    record = {"device": backend.device_name, "model": model.name, "cpu_nodes": runner.cpu_nodes, "lent": lent}
    record |= {"equal_to_run": same, **agreed}
    write(out, "edges", record | {"stale_read_refused": refused, "ok": ok, "outcome": "PASS" if ok else "FAIL"})
    print(record, refused)
    if not ok:
        print(f"edges: FAIL: {model.name}'s kept outputs on onnxruntime-cuda: see the line above")
        return 1
    print(f"edges: PASS: {model.name}'s kept outputs on onnxruntime-cuda are its bound buffers, equal to run's")
    return 0
