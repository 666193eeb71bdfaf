"""Pipelines against the client chaining the same calls, beside their floors (issue 29).

    python bench/pipeline.py [--rounds 10] [--per-round 40] [--flood-s 8] [--json FILE]

Two pipelines, served by one fresh daemon from a repository of the demo models:
  light-chain   mlp-light, widen, mlp-light, widen, mlp-light: five cheap steps in a
                chain (`widen`, a Python step, tiles 10 scores into 64 features), where
                the cost of a step beyond its compute shows
  demo-ensemble docs/examples/demo-ensemble: cnn-heavy beside (pool, then mlp-light),
                joined by a Python step
Unloaded, every round measures, in an order rotated from round to round, each pipeline:
  pipeline      one request to the daemon (realtime class), raw frames encoded once,
                as the echo's are
  chained       the client making the same calls itself: each model step a request
                (realtime), each Python step run in the client, as a client does today
  in_process    the steps run in this process, one after another (ONNX Runtime, one
                intra-op thread as a lane's sessions have): the sum of their compute
  echo          a bare ZeroMQ DEALER/ROUTER echo of the pipeline's request: one round trip
The target: pipeline p50 <= in_process p50 + echo p50 + 100 us per step. The overhead
per step is (pipeline - echo - in_process) / steps, at p50.
Then, loaded: realtime light-chain requests at 50/s (the realtime class's 20 ms
deadline) beside a bulk flood of demo-ensemble at 3x bulk's capacity for it (its goodput
alone, offered far more than it can take, measured first), each stream from a process
and a socket of its own. Reported: each stream's statuses and latency, and what the
daemon's counters say expired after admission, in each class.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from paths import ROOT, dealer, helper_server

from edged.client import Client
from edged.loadgen.launch import DaemonProcess
from edged.loadgen.sweep import Stream, run_load
from edged.wire.codec import encode_request

EXAMPLE = ROOT / "docs" / "examples" / "demo-ensemble"
# Every request's deadline, both ways: this bench times what a request costs, not whether
# admission takes it; with realtime's 20 ms, a busy box's pipeline bound (28.8 ms at load
# 10) shed the first request and ended the run.
DEADLINE_MS = 1000.0

CHAIN = """
description = "mlp-light three times, a Python step between each two"

[inputs]
x = { dtype = "float32", shape = [-1, 64] }

[[steps]]
name = "first"
model = "mlp-light"
inputs = { x = "x" }

[[steps]]
name = "widen1"
python = "chain:widen"
inputs = { scores = "first.scores" }
outputs = { x = { dtype = "float32", shape = [-1, 64] } }

[[steps]]
name = "second"
model = "mlp-light"
inputs = { x = "widen1.x" }

[[steps]]
name = "widen2"
python = "chain:widen"
inputs = { scores = "second.scores" }
outputs = { x = { dtype = "float32", shape = [-1, 64] } }

[[steps]]
name = "third"
model = "mlp-light"
inputs = { x = "widen2.x" }

[outputs]
scores = "third.scores"
"""
CHAIN_STEPS = '''"""light-chain's Python step."""

import numpy as np


def widen(scores):
    """10 scores to 64 features: tiled, then cut."""
    return {"x": np.ascontiguousarray(np.tile(scores, (1, 7))[:, :64])}
'''
STEPS = {"light-chain": 5, "demo-ensemble": 4}
REALTIME_RPS, FLOOD_FACTOR = 50.0, 3.0


def repository(folder: Path) -> Path:
    root = folder / "models"
    for model in ("mlp-light", "cnn-heavy"):
        shutil.copytree(ROOT / "engines" / model, root / model)
    shutil.copytree(EXAMPLE, root / "demo-ensemble")
    (root / "light-chain").mkdir()
    (root / "light-chain" / "pipeline.toml").write_text(CHAIN)
    (root / "light-chain" / "chain.py").write_text(CHAIN_STEPS)
    return root


class Steps:
    """Each pipeline's steps, for the client's chain and in process."""

    def __init__(self, root: Path) -> None:
        import importlib.util

        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.sessions = {
            m: ort.InferenceSession(str(root / m / "model.onnx"), options) for m in ("mlp-light", "cnn-heavy")
        }
        self.glue = {}
        for name, path in (
            ("ensemble", root / "demo-ensemble" / "ensemble.py"),
            ("chain", root / "light-chain" / "chain.py"),
        ):
            spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            self.glue[name] = module

    def run(self, pipeline: str, x: np.ndarray, model: Callable[[str, str, np.ndarray], np.ndarray]) -> np.ndarray:
        """The pipeline's steps, each model step through `model(name, input name, array)`."""
        if pipeline == "light-chain":
            widen = self.glue["chain"].widen
            scores = model("mlp-light", "x", x)
            scores = model("mlp-light", "x", widen(scores)["x"])
            return model("mlp-light", "x", widen(scores)["x"])
        ensemble = self.glue["ensemble"]
        heavy = model("cnn-heavy", "image", x)
        light = model("mlp-light", "x", ensemble.pool(x)["x"])
        return ensemble.join(heavy, light)["probabilities"]

    def local(self, name: str, input_name: str, x: np.ndarray) -> np.ndarray:
        return self.sessions[name].run(None, {input_name: x})[0]


def percentiles(samples: list[float]) -> dict[str, float]:
    values = np.array(samples)
    return {"n": len(samples), **{p: round(float(np.percentile(values, q)), 1) for p, q in (("p50", 50), ("p99", 99))}}


def unloaded(endpoint: str, echo: str, steps: Steps, rounds: int, per_round: int) -> dict[str, Any]:
    inputs = {"light-chain": ("x", (1, 64)), "demo-ensemble": ("image", (1, 3, 64, 64))}
    samples: dict[str, dict[str, list[float]]] = {p: {} for p in inputs}
    daemon_us: dict[str, list[int]] = {p: [] for p in inputs}
    echo_sock, daemon_sock = dealer(echo), dealer(endpoint)
    with Client(endpoint) as client:

        def remote(name: str, input_name: str, x: np.ndarray) -> np.ndarray:
            return next(iter(client.infer(name, {input_name: x}, klass="realtime", deadline_ms=DEADLINE_MS).values()))

        def timed(pipeline: str, how: str, x: np.ndarray, frames: list[bytes]) -> float:
            start = time.perf_counter_ns()
            if how == "pipeline":
                # Raw frames, encoded once, as the echo's are: the client library's own
                # encoding and decoding are neither the daemon's cost nor the floor's.
                daemon_sock.send_multipart(frames)
                header = daemon_sock.recv_multipart()[0]
                elapsed = (time.perf_counter_ns() - start) / 1000
                reply = msgpack.unpackb(header)
                assert reply["status"] == "OK", reply
                daemon_us[pipeline].append(reply["timing_us"]["total"])
                return elapsed
            if how == "chained":
                steps.run(pipeline, x, remote)
            elif how == "in_process":
                steps.run(pipeline, x, steps.local)
            else:
                echo_sock.send_multipart(frames)
                echo_sock.recv_multipart()
            return (time.perf_counter_ns() - start) / 1000

        paths = ["pipeline", "chained", "in_process", "echo"]
        for pipeline, (name, shape) in inputs.items():
            x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
            frames = [
                bytes(f)
                for f in encode_request(1, model=pipeline, klass="realtime", deadline_ms=DEADLINE_MS, inputs={name: x})
            ]
            for how in paths:
                for _ in range(10):  # warm every path
                    timed(pipeline, how, x, frames)
            daemon_us[pipeline].clear()
            for r in range(rounds):
                for how in paths[r % len(paths) :] + paths[: r % len(paths)]:
                    for _ in range(per_round):
                        samples[pipeline].setdefault(how, []).append(timed(pipeline, how, x, frames))
    echo_sock.close()
    daemon_sock.close()
    results: dict[str, Any] = {}
    for pipeline, by_path in samples.items():
        figures = {how: percentiles(values) for how, values in by_path.items()}
        figures["daemon_total_us"] = percentiles([float(v) for v in daemon_us[pipeline]])
        floor = figures["in_process"]["p50"] + figures["echo"]["p50"]
        figures["steps"] = STEPS[pipeline]
        figures["target_p50_us"] = round(floor + 100 * STEPS[pipeline], 1)
        figures["overhead_per_step_us"] = round((figures["pipeline"]["p50"] - floor) / STEPS[pipeline], 1)
        figures["chained_overhead_per_step_us"] = round((figures["chained"]["p50"] - floor) / STEPS[pipeline], 1)
        results[pipeline] = figures
    return results


def counters(client: Client) -> dict[str, dict[str, int]]:
    classes = client.stats()["classes"]
    return {name: {"expired": c["expired"], "admitted": c["admitted"]} for name, c in classes.items()}


def loaded(endpoint: str, flood_s: float) -> dict[str, Any]:
    with Client(endpoint) as client:
        inputs = {m["name"]: m["inputs"] for m in client.models()}
        alone = run_load(endpoint, [Stream("bulk", "demo-ensemble", 2000.0)], inputs, 3.0)[0]
        capacity = alone["goodput_rps"]
        time.sleep(1.0)  # the queue drains
        before = counters(client)
        streams = [
            Stream("realtime", "light-chain", REALTIME_RPS),
            Stream("bulk", "demo-ensemble", FLOOD_FACTOR * capacity),
        ]
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            flood = pool.submit(run_load, endpoint, streams[1:], inputs, flood_s)
            rows = run_load(endpoint, streams[:1], inputs, flood_s) + flood.result()
        time.sleep(1.0)
        after = counters(client)
    moved = {name: {key: after[name][key] - before[name][key] for key in ("expired", "admitted")} for name in after}
    return {"bulk_capacity_rps": capacity, "streams": {row["class"]: row for row in rows}, "daemon": moved}


def report(results: dict[str, Any]) -> str:
    lines = ["unloaded, us (p50 / p99):"]
    for pipeline, f in results["unloaded"].items():
        cells = "  ".join(
            f"{how} {f[how]['p50']:.0f} / {f[how]['p99']:.0f}" for how in ("pipeline", "chained", "in_process", "echo")
        )
        lines.append(f"  {pipeline} ({f['steps']} steps): {cells}; daemon's total {f['daemon_total_us']['p50']:.0f}")
        met = f["pipeline"]["p50"] <= f["target_p50_us"]
        lines.append(
            f"    target p50 <= {f['target_p50_us']:.0f}: {'met' if met else 'NOT met'}; "
            f"beyond compute and one round trip, per step: pipeline {f['overhead_per_step_us']:.0f} us, "
            f"chained {f['chained_overhead_per_step_us']:.0f} us"
        )
    load = results["loaded"]
    lines.append(
        f"loaded: bulk demo-ensemble at {FLOOD_FACTOR}x its capacity alone ({load['bulk_capacity_rps']:.1f}/s):"
    )
    for klass, row in load["streams"].items():
        lat = row["latency_us"]
        expired, admitted = load["daemon"][klass]["expired"], load["daemon"][klass]["admitted"]
        lines.append(
            f"  {klass} {row['model']}: sent {row['sent']}, ok {row['ok_fraction']:.2%}, "
            f"overloaded {row['overloaded']}, "
            f"deadline_exceeded {row['deadline_exceeded']}, lost {row['lost']}; p50 {lat['p50'] / 1000:.2f} ms, "
            f"p99 {lat['p99'] / 1000:.2f} ms; expired after admission {expired} of {admitted}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=40)
    parser.add_argument("--flood-s", type=float, default=8.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edged-pipe-") as folder:
        root = repository(Path(folder))
        config = Path(folder) / "edged.toml"
        config.write_text(f'[server]\nmodel_repository = "{root}"\n')
        endpoint, echo = f"ipc://{folder}/edged.sock", f"ipc://{folder}/echo.sock"
        echo_server = helper_server("zmq_echo", echo)
        try:
            with DaemonProcess([endpoint], config=config, log_path=Path(folder) / "daemon.log") as daemon:
                daemon.wait_serving()
                results = {"unloaded": unloaded(endpoint, echo, Steps(root), args.rounds, args.per_round)}
            with DaemonProcess([endpoint], config=config, log_path=Path(folder) / "daemon2.log") as daemon:
                daemon.wait_serving()
                results["loaded"] = loaded(endpoint, args.flood_s)
        finally:
            echo_server.kill()
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
