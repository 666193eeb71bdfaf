"""Checks of the GPU path that the tests and the benchmark cannot make, on a lent GPU machine.

    python bench/gpu_checks.py preflight [--out DIR]
    python bench/gpu_checks.py stream [--out DIR]
    python bench/gpu_checks.py memory [--out DIR]
    python bench/gpu_checks.py green [--out DIR]
    python bench/gpu_checks.py weights [--out DIR]
    python bench/gpu_checks.py ipc [--out DIR]
    python bench/gpu_checks.py edges [--out DIR]

Ran on an NVIDIA H200 and an NVIDIA H100 (2026-11-27; docs/benchmarks-gpu.md), through
bench/gpu_verify.sh, which runs them all.

preflight: what the machine is, in a few seconds (bench/gpu_check_preflight.py).

stream: that ONNX Runtime launches a lane's kernels on the lane's own stream, the one
edged hands it as `user_compute_stream`. In this process, a runner for mlp-light (as
bench/gpu_bench.py's floor, plain and with CUDA graphs) is loaded on a thread of its
own, as a lane's worker, and first runs one input there, so the device input buffer
holds it; then a wait on a flag in mapped pinned host memory (cuStreamWaitValue32) is
enqueued on the runner's stream, and the same thread runs a second input (ONNX Runtime
keeps CUDA graphs per thread: the load-time graphs replay). Its input copies queue
behind the wait. After 200 ms the call must still be
running; the flag is set from the host; the outputs must then match the CPU's for the
second input. Kernels launched on any other stream would have run at once, on the
first input still in the buffer, and the outputs would be the first input's.

memory: that a daemon on onnxruntime-cuda keeps serving when the rest of the card is
taken. For its default classes, and again with `cuda_graph = true` on realtime: start
it, read each lane's planned and measured bytes from `stats`, fill the card from this
process with cudaMalloc chunks (256 MiB, halving down to 1 MiB) until about 64 MiB is
left, then send every class a request at every batch size from 1 to its max_batch for
every model; each reply must be OK and agree with ONNX Runtime's CPU provider within
the TF32 bound (edged.backends.tf32). Then the filler is freed and the daemon stopped.

green: that ONNX Runtime computes correctly on a green context's stream, with cuDNN: a
runner for cnn-heavy (convolutions) in a class with `sm_count` = BULK_SMS, as the GPU
benchmark's last scenario, at 1, 5 and 16 rows, each against the CPU within the TF32
bound. bench/gpu_verify.sh runs it before that scenario, which runs only if it passed.

weights: that a model's weights are on the device once, whatever the number of its
sessions (edged.backends.device_weights). A daemon on onnxruntime-cuda serves one large
model (three 4096 x 4096 float32 MatMuls, 192 MiB) with the built-in classes (four
sessions: realtime's worker and inline path, standard's, bulk's); from `stats` and
`models`: the model's weights must have taken 0.9 to 1.5 times its file of device
memory, once, and each lane less than half a copy per session of its own (a session
that copied the weights would take a whole one: ONNX Runtime copies a shared
initializer whose device is not the one it planned, logging "Cannot use user supplied
initializer"). One request per class must agree with the CPU within the TF32 bound.

ipc: that a lane reads a client's device memory through CUDA IPC, and answers as the
frame path does, for a 25 MB frame; and the round trip's overhead beyond compute against
the issue's 2 ms target (bench/gpu_check_ipc.py says how).

edges: that a pipeline's kept edge is what the runner made (edged.backends.KeepsOnDevice):
a runner for mlp-light on onnxruntime-cuda runs one input with `run`, then with
`run_keeping` keeping every output; each must come back as a DeviceTensor whose bytes,
read back, equal `run`'s download and the CPU's within the TF32 bound (the I/O binding
writes into edged's own buffer); after one more call, reading it must be refused.

Each prints a table and a verdict line last, writes DIR/gpu-checks-NAME.json as it goes
(with an `outcome`; an exception or a SIGTERM adds its `error` to what was written), and
exits non-zero on failure: 3 (UNSUPPORTED) where a feature the check needs failed in
CUDA (IPC, green contexts, stream waits: see FEATURE_FAILED), with CUDA's error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends.cuda import cuda_available
from edged.backends.tf32 import TF32_PER_LAYER, tf32_atol
from edged.models.repository import ModelEntry, discover
from edged.wire.codec import DTYPES

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
UNSUPPORTED = 3  # exit code: the device cannot run the check
FP32_SEEN_ABOVE = 16
CHECKS = ("preflight", "stream", "memory", "green", "weights", "ipc", "edges")
# A failed call of a feature some machines lack (CUDA IPC, green contexts, stream waits
# on mapped host memory: unproven under gVisor): the check is UNSUPPORTED there, with
# CUDA's error, not FAIL, and the plan goes on.
FEATURE_FAILED = re.compile(
    r"\b(cudaIpc\w*|cuGreenCtx\w*|cuDev\w*Resource\w*|cuStreamWaitValue32|cudaHostAlloc|cudaHostGetDevicePointer)"
    r" failed:|needs green contexts"
)


def needs_gpu(check: str) -> None:
    reason = cuda_available()
    if reason is not None:
        raise SystemExit(f"gpu_checks.py {check} needs a CUDA GPU, and this machine has none usable: {reason}")


def model_named(name: str) -> ModelEntry:
    return next(m for m in discover(ROOT / "engines", "onnxruntime") if m.name == name)


def random_inputs(model: ModelEntry, rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    signature = model.signature
    return {s.name: rng.standard_normal(signature.shape_at(s, rows)).astype(DTYPES[s.dtype]) for s in signature.inputs}


class CpuReference:
    """The models on ONNX Runtime's CPU provider, in this process."""

    def __init__(self) -> None:
        import onnxruntime as ort

        self._ort, self._sessions = ort, {}

    def run(self, model: ModelEntry, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        if model.name not in self._sessions:
            path = str(model.variant.path)
            self._sessions[model.name] = self._ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        return self._sessions[model.name].run(list(model.signature.output_names), inputs)


def worst(model: ModelEntry, got: list[np.ndarray], expected: list[np.ndarray]) -> tuple[float, float]:
    """(largest error, its bound) over the outputs: the bound is TF32's per output."""
    pairs = [(float(np.abs(g - e).max()), tf32_atol(model, e)) for g, e in zip(got, expected, strict=True)]
    return max(pairs, key=lambda p: p[0] - p[1])


def agreement(model: ModelEntry, got: list[np.ndarray], expected: list[np.ndarray]) -> dict[str, Any]:
    """The largest error against the CPU, its TF32 bound, and whether TF32 shows: an error
    above FP32_SEEN_ABOVE times what float32's own rounding could make (2**-23 per layer),
    which a GPU computing in float32 would not reach. Within the bound is not enough to
    say that TF32 is in use; above float32's level is."""
    error, bound = worst(model, got, expected)
    fp32 = bound / TF32_PER_LAYER * 2**-23 * FP32_SEEN_ABOVE
    return {"max_error": error, "bound": bound, "fp32_level": fp32, "tf32_in_use": error > fp32}


def write(out: Path, check: str, record: dict[str, Any]) -> None:
    """Replace DIR/gpu-checks-CHECK.json whole (a packer reading it meanwhile sees the
    last complete record); a check calls it as each part ends, so a kill keeps those."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu-checks-{check}.json"
    partial = path.with_suffix(".json.part")
    partial.write_text(json.dumps(record, indent=2, default=str) + "\n")
    partial.replace(path)


def json_of(out: Path, check: str) -> dict[str, Any]:
    """What the check wrote so far ({} when nothing, or nothing readable)."""
    try:
        record = json.loads((out / f"gpu-checks-{check}.json").read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def unsupported(exc: BaseException) -> str | None:
    """CUDA's error, where `exc` says a feature that some machines lack (CUDA IPC, green
    contexts, stream waits on mapped host memory: unproven under gVisor) failed; else None."""
    text = str(exc)
    return text if FEATURE_FAILED.search(text) else None


class Ended(BaseException):
    """SIGTERM: bench/gpu_verify.sh's `timeout` at a step's limit. A BaseException, so that
    no `except Exception` of a check or scenario takes it for a failure and goes on."""


ENDED = "ended by its step's time limit (SIGTERM)"


def on_sigterm(first: Callable[[], None]) -> None:
    """At SIGTERM, `first` (write down what there is: the unwinding that follows may not
    finish within timeout's grace), then Ended, so that the daemons stop on the way out."""

    def ended(signum: int, frame: object) -> None:
        try:
            first()
        finally:
            raise Ended(ENDED)

    signal.signal(signal.SIGTERM, ended)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", choices=CHECKS)
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for gpu-checks-CHECK.json")
    args = parser.parse_args(argv)
    on_sigterm(lambda: write(args.out, args.check, json_of(args.out, args.check) | {"outcome": "FAIL", "error": ENDED}))
    # Each check in a module of its own beside this one (bench/ is on sys.path when run as a script).
    try:
        if args.check != "preflight":  # the preflight reports what there is, GPU or not
            needs_gpu(args.check)
        return importlib.import_module(f"gpu_check_{args.check}").run(args.out)
    except BaseException as exc:  # one check's failure is written into its JSON, never lost
        if isinstance(exc, KeyboardInterrupt):
            raise
        reason = unsupported(exc)
        outcome = "UNSUPPORTED" if reason else "FAIL"
        text = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, str) else f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, SystemExit):
            traceback.print_exc()
        record = json_of(args.out, args.check) | {"outcome": outcome, "error": text}
        write(args.out, args.check, record)
        print(f"{args.check}: {outcome}: {text}", file=sys.stderr)
        return UNSUPPORTED if reason else 1


if __name__ == "__main__":
    sys.exit(main())
