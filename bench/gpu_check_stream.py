"""bench/gpu_checks.py stream: that ONNX Runtime computes on the lane's stream (see there).
Ran on an NVIDIA H200 and an NVIDIA H100 (2026-11-27; docs/benchmarks-gpu.md)."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_checks import UNSUPPORTED, CpuReference, agreement, model_named, random_inputs, unsupported, worst, write

from edged.backends.cuda_calls import CudaError, check, runtime
from edged.config import ClassConfig
from edged.models.repository import ModelEntry

HELD_S = 0.2  # how long the check holds the lane's stream
LOAD_S = 120  # for the runner's load (captures included) and its first run


class MappedFlag:
    """A 32-bit word of pinned host memory mapped into the device (cudaHostAlloc with
    cudaHostAllocMapped): the host sets it, a stream waiting on it sees the change."""

    def __init__(self) -> None:
        rt = runtime()
        self.host = int(check("cudaHostAlloc", rt.cudaHostAlloc(4, rt.cudaHostAllocMapped)))
        self.word = ctypes.c_uint32.from_address(self.host)
        self.word.value = 0
        self.device = int(check("cudaHostGetDevicePointer", rt.cudaHostGetDevicePointer(self.host, 0)))

    def set(self, value: int) -> None:
        self.word.value = value

    def close(self) -> None:
        check("cudaFreeHost", runtime().cudaFreeHost(self.host))


def can_map_host_memory() -> bool:
    rt = runtime()
    attribute = rt.cudaDeviceAttr.cudaDevAttrCanMapHostMemory
    return bool(check("cudaDeviceGetAttribute", rt.cudaDeviceGetAttribute(attribute, 0)))


def held_run(
    load: Callable[[], Any], model: ModelEntry, cpu: CpuReference, flag: Callable[[], Any] = MappedFlag
) -> dict[str, Any]:
    """One gated run on the stream of the runner `load` makes (see the module's docstring).

    ONNX Runtime keeps CUDA graphs per thread, so the runner is loaded (its graphs captured),
    run, held and closed on one thread, as a lane's worker does: a run on another thread
    would capture anew behind the wait instead of replaying the graphs made at load."""
    names = list(model.signature.output_names)
    first, gated = random_inputs(model, 4, seed=1), random_inputs(model, 4, seed=2)
    loaded, go, done = threading.Event(), threading.Event(), {}

    def work() -> None:
        try:
            runner = done["runner"] = load()
        except BaseException as exc:  # reported below
            done["error"] = repr(exc)
            loaded.set()
            return
        try:
            runner.run(first, names)  # the device input buffer now holds `first`
            loaded.set()
            go.wait()
            done["outputs"] = runner.run(gated, names)
        except BaseException as exc:  # reported below
            done["error"] = repr(exc)
        finally:
            loaded.set()
            runner.close()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    loaded.wait(LOAD_S)
    if "error" in done or not loaded.is_set():
        go.set()
        thread.join(LOAD_S)
        return {"held": False, "error": done.get("error", f"the runner did not load and run within {LOAD_S} s")}
    mapped = flag()
    held = False
    try:
        done["runner"].stream.wait_value32(mapped.device, 1)
        go.set()
        time.sleep(HELD_S)
        held = thread.is_alive()
    finally:
        mapped.set(1)  # whatever happened, release the stream
        go.set()
        thread.join(60)
        if not thread.is_alive():
            mapped.close()  # else the stream may still read it: left allocated
    if "outputs" not in done:
        return {"held": held, "error": done.get("error", "the run did not finish within 60 s of the release")}
    agreed = agreement(model, done["outputs"], cpu.run(model, gated))
    apart, _ = worst(model, cpu.run(model, first), cpu.run(model, gated))
    # `apart` > `bound`: the first input's outputs would be told from the second's.
    ok = held and agreed["max_error"] <= agreed["bound"] < apart
    return {"held": held, **agreed, "inputs_apart": apart, "cpu_nodes": done["runner"].cpu_nodes, "ok": ok}


def why_failed(result: dict[str, Any]) -> str:
    mode = f"{result['model']} " + ("with CUDA graphs" if result["cuda_graph"] else "plain")
    if "error" in result:
        return f"{mode}: the held run failed: {result['error']}"
    if not result["held"]:
        return f"{mode}: the run returned before the release, so the wait did not hold even edged's own copies"
    if not result["bound"] < result["inputs_apart"]:
        return f"{mode}: the two inputs' outputs are too close to tell apart (vacuous): {result}"
    return (
        f"{mode}: the outputs differ from the CPU's (error {result['max_error']:.3g} above {result['bound']:.3g}): "
        "kernels ran before the inputs copied in behind the wait, so not on the lane's stream"
    )


# mlp-light through cuBLAS, plain and with CUDA graphs; cnn-heavy through cuDNN, whose
# handle ONNX Runtime binds to a stream of its own choosing unless it takes the lane's.
RUNS = (("mlp-light", False), ("mlp-light", True), ("cnn-heavy", False))


def run(out: Path) -> int:
    from edged.backends.onnxruntime_cuda import OnnxRuntimeCuda

    if not can_map_host_memory():
        write(out, "stream", {"outcome": "UNSUPPORTED", "error": "cudaDevAttrCanMapHostMemory = 0"})
        print("stream: UNSUPPORTED: the device cannot map pinned host memory (cudaDevAttrCanMapHostMemory = 0)")
        return UNSUPPORTED
    cpu, backend, results = CpuReference(), OnnxRuntimeCuda(), []
    record: dict[str, Any] = {"device": backend.device_name, "held_s": HELD_S, "runs": results}
    for name, cuda_graph in RUNS:
        model = model_named(name)
        klass = ClassConfig(
            "realtime", order=0, max_batch=4, stream_priority=-1, arena_cap_mb=512, cuda_graph=cuda_graph
        )
        try:
            backend.reserve([model], [klass], backend.free_bytes())
            result = held_run(lambda klass=klass, model=model: backend.load(model, klass), model, cpu)
        except CudaError as exc:
            if unsupported(exc):
                raise  # the stream wait itself: gpu_checks.py records UNSUPPORTED beside the runs so far
            result = {"held": False, "error": repr(exc)}
        results.append({"model": name, "cuda_graph": cuda_graph, **result})
        print(f"{name} cuda_graph={cuda_graph}: {result}", flush=True)
        write(out, "stream", record)
    failed = [why_failed(r) for r in results if not r.get("ok")]
    record["outcome"] = "FAIL" if failed else "PASS"
    write(out, "stream", record)
    if failed:
        print("stream: FAIL: " + "; ".join(failed))
        return 1
    print(
        f"stream: PASS: held {HELD_S * 1000:.0f} ms by a wait on the lane's stream, then equal to the CPU "
        "(mlp-light plain and with CUDA graphs, cnn-heavy through cuDNN): ONNX Runtime computes on the lane's stream"
    )
    return 0
