"""How ONNX Runtime's CPU build can hold one copy of a model's weights for several
runners (issue 23's first question), on a large model, in this process.

    python bench/weights_sharing.py [--runners 4] [--runs 30]

The model: three 4096x4096 float32 MatMuls (192 MiB of weights), written to a
temporary folder. Each way is measured in a process of its own, so that one's
freed memory is not another's: the RSS it adds for 1 and `--runners` runners, and
the p50 of one call while two threads call its first and last runner at once (the
same runner, when there is one).
  private          a session per runner (what edged does today: one per worker per class)
  shared values    a session per runner, each given the same initializers as OrtValues
                   (SessionOptions.add_initializer)
  ... no prepack   the same, with the sessions' weight pre-packing off
  one session      one session, called by every runner's thread (ONNX Runtime's Run
                   may be called from several threads at once; with one intra-op
                   thread, each call computes on its caller's thread)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from edged.backends.host_memory import rss_bytes
from edged.loadgen.large_model import write_matmuls

SIDE = 4096
WAYS = ("private", "shared values", "shared values, no prepack", "one session")


def rss_mib() -> float:
    return rss_bytes() / 2**20


def measure(way: str, path: Path, runners: int, runs: int) -> str:
    """One way, in this process: the RSS its runners add, and a call's p50 with two at once."""
    before = rss_mib()
    shared: dict[str, ort.OrtValue] = {}
    if way.startswith("shared"):
        for initializer in onnx.load(str(path)).graph.initializer:
            shared[initializer.name] = ort.OrtValue.ortvalue_from_numpy(numpy_helper.to_array(initializer))

    def session() -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if way.endswith("no prepack"):
            options.add_session_config_entry("session.disable_prepacking", "1")
        for name, value in shared.items():
            options.add_initializer(name, value)
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    one = session() if way == "one session" else None
    sessions = [one or session() for _ in range(runners)]
    x = np.ones((1, SIDE), np.float32)
    outputs = [s.run(None, {"x": x})[0] for s in sessions]
    assert all(np.array_equal(outputs[0], out) for out in outputs)
    added = rss_mib() - before
    times: list[float] = []

    def call(s: ort.InferenceSession) -> None:
        for _ in range(runs):
            start = time.perf_counter_ns()
            s.run(None, {"x": x})
            times.append((time.perf_counter_ns() - start) / 1e6)

    threads = [threading.Thread(target=call, args=(s,)) for s in (sessions[0], sessions[-1])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return f"{way:<26} {runners:>7} {added:>9.0f} {statistics.median(times):>8.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runners", type=int, default=4)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one way, in a child process
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way:
        print(measure(args.way, args.model, args.runners, args.runs))
        return 0
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "large.onnx"
        write_matmuls(path, SIDE)
        print(f"{'way':<26} {'runners':>7} {'RSS MiB':>9} {'p50 ms':>8}  (p50: one call, two at once)")
        for way in WAYS:
            for runners in (1, args.runners):
                command = [sys.executable, __file__, "--way", way, "--model", str(path), "--runners", str(runners)]
                done = subprocess.run([*command, "--runs", str(args.runs)], capture_output=True, text=True, check=True)
                print(done.stdout.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
