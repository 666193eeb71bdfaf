"""bench/gpu_checks.py preflight: what the machine is, in a few seconds, before anything long.

Each item is tried on its own and recorded, whatever the others do: `nvidia-smi`, the
kernel (`uname -r`; 4.4.0 is gVisor, where CUDA IPC, green contexts and stream waits
are unproven), the versions that matter, the CUDA device, a green context's stream, and
a `cuStreamWaitValue32` on mapped host memory that must hold its stream until the host
sets the word. An item a machine lacks is UNSUPPORTED with CUDA's error; the check
fails only when there is no CUDA device at all. Ran on an NVIDIA H200 and an NVIDIA H100
(2026-11-27; docs/benchmarks-gpu.md).
"""

from __future__ import annotations

import importlib
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_checks import unsupported, write

SMI = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used,utilization.gpu", "--format=csv"]
HOLD_S = 0.2  # how long the stream wait must hold before the host releases it


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in ("onnxruntime", "cuda.bindings", "numpy", "zmq", "msgspec", "msgpack", "onnx"):
        try:
            module = importlib.import_module(name)
            found[name] = f"{getattr(module, '__version__', '?')} ({Path(module.__file__ or '?').parent})"
        except Exception as exc:  # a missing module is a finding, not a failure of the preflight
            found[name] = f"missing: {exc}"
    return found


def onnxruntime_build() -> dict[str, Any]:
    import onnxruntime as ort

    return {"available_providers": ort.get_available_providers(), "cuda_version": getattr(ort, "cuda_version", None)}


def device() -> dict[str, Any]:
    from edged.backends.cuda import cuda_available, device_info, memory_info, priority_range

    reason = cuda_available()
    if reason is not None:
        raise RuntimeError(reason)
    info = device_info(0)
    free, total = memory_info()
    return {"name": info.name, "compute_capability": list(info.compute_capability), "free": free, "total": total} | {
        "stream_priorities": list(priority_range())
    }


def green_context() -> dict[str, Any]:
    from edged.backends.green import green_stream

    stream = green_stream(8, 0)
    stream.close()
    return {"sm_count": 8}


def stream_wait() -> dict[str, Any]:
    """The wait holds a plain stream (cudaStreamQuery: not ready) until the host sets the word."""
    from gpu_check_stream import MappedFlag

    from edged.backends.cuda import Stream
    from edged.backends.cuda_calls import runtime

    rt, stream, flag = runtime(), Stream(0), MappedFlag()
    try:
        stream.wait_value32(flag.device, 1)
        time.sleep(HOLD_S)
        held = rt.cudaStreamQuery(stream.handle)[0] == rt.cudaError_t.cudaErrorNotReady
        flag.set(1)
        deadline = time.monotonic() + 5
        while rt.cudaStreamQuery(stream.handle)[0] != rt.cudaError_t.cudaSuccess and time.monotonic() < deadline:
            time.sleep(0.01)
        released = rt.cudaStreamQuery(stream.handle)[0] == rt.cudaError_t.cudaSuccess
    finally:
        flag.set(1)
        stream.close()
        flag.close()
    if not (held and released):
        raise RuntimeError(f"cuStreamWaitValue32 did not hold and release its stream: held {held}, released {released}")
    return {"held_s": HOLD_S}


def command(argv: list[str]) -> dict[str, Any]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=15)
    return {"rc": done.returncode, "stdout": done.stdout.strip(), "stderr": done.stderr.strip()[-2000:]}


ITEMS: dict[str, Callable[[], dict[str, Any]]] = {
    "nvidia-smi": lambda: command(SMI),
    "kernel": lambda: {"release": platform.release(), "gvisor": platform.release().startswith("4.4.0")},
    "versions": versions,
    "onnxruntime": onnxruntime_build,
    "device": device,
    "green_context": green_context,
    "stream_wait": stream_wait,
}


def run(out: Path) -> int:
    record: dict[str, Any] = {}
    for name, item in ITEMS.items():
        started = time.monotonic()
        try:
            record[name] = {"outcome": "ok", **item()}
        except Exception as exc:  # each item is a finding of its own
            reason = unsupported(exc)
            record[name] = {"outcome": "UNSUPPORTED" if reason else "FAIL", "error": f"{type(exc).__name__}: {exc}"}
        record[name]["seconds"] = round(time.monotonic() - started, 3)
        print(f"{name}: {record[name]}", flush=True)
        write(out, "preflight", record)
    record["outcome"] = "PASS" if record["device"]["outcome"] == "ok" else "FAIL"
    write(out, "preflight", record)
    print(f"preflight: {record['outcome']}: " + ", ".join(f"{n} {record[n]['outcome']}" for n in ITEMS))
    return 0 if record["outcome"] == "PASS" else 1
