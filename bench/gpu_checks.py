"""Checks of the GPU path that the tests and the benchmark cannot make, on a lent GPU machine.

    python bench/gpu_checks.py stream [--out DIR]
    python bench/gpu_checks.py memory [--out DIR]
    python bench/gpu_checks.py green [--out DIR]
    python bench/gpu_checks.py weights [--out DIR]
    python bench/gpu_checks.py ipc [--out DIR]
    python bench/gpu_checks.py edges [--out DIR]

NOT YET RUN: written on machines with no GPU (see bench/gpu_verify.sh, which runs both).

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

Each prints a table and a verdict line last, writes DIR/gpu-checks-NAME.json, and exits
non-zero on failure (3 where the device cannot run the check at all).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends.cuda import cuda_available
from edged.backends.tf32 import tf32_atol
from edged.models.repository import ModelEntry, discover
from edged.wire.codec import DTYPES

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
UNSUPPORTED = 3  # exit code: the device cannot run the check


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


def write(out: Path, check: str, record: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"gpu-checks-{check}.json").write_text(json.dumps(record, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", choices=("stream", "memory", "green", "weights", "ipc", "edges"))
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for gpu-checks-CHECK.json")
    args = parser.parse_args(argv)
    needs_gpu(args.check)
    # Each check in a module of its own beside this one (bench/ is on sys.path when run as a script).
    check = importlib.import_module(f"gpu_check_{args.check}")
    return check.run(args.out)


if __name__ == "__main__":
    sys.exit(main())
