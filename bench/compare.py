"""Put edged beside its floors and a naive server, on the same models, in one run.

    python bench/compare.py [--quick] [--write-docs]

Measured, one after another on this machine:
  in-process    the model run by onnxruntime in this process (the compute floor)
  zmq echo      a bare DEALER/ROUTER round trip of a request-sized message (the transport floor)
  naive server  one thread: recv, decode, run, reply (what edged must not be worse than)
  edged         the daemon, same requests, same raw client
  pytriton      a Triton server through PyTriton, given --triton-python: an interpreter
                with nvidia-pytriton installed (see compare_triton.py)
then the overload scenario: bulk floods the heavy model at 3x its capacity while
realtime sends to the light model, against the same realtime stream alone.
Round trips are closed-loop (one request at a time), timed in the client.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from edged.bench import Stream, format_table, progress_to_stderr, run_load
from edged.launch import DaemonProcess
from edged.wire.codec import encode_request

ROOT = Path(__file__).resolve().parents[1]

MODELS = {"mlp-light": ("x", (1, 64)), "cnn-heavy": ("image", (1, 3, 64, 64))}


def percentiles(samples_us: list[float]) -> dict[str, float]:
    values = np.array(samples_us)
    return {k: round(float(np.percentile(values, q)), 1) for k, q in (("p50", 50), ("p99", 99), ("p999", 99.9))}


def in_process(model: str, runs: int) -> dict[str, float]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(ROOT / "engines" / model / "model.onnx"), options)
    name, shape = MODELS[model]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for _ in range(20):
        session.run(None, {name: x})
    samples = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        session.run(None, {name: x})
        samples.append((time.perf_counter_ns() - start) / 1000)
    return percentiles(samples)


def round_trips(endpoint: str, model: str, runs: int) -> dict[str, float]:
    """Closed-loop round trips of one protocol request, raw frames, timed here."""
    name, shape = MODELS[model]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    # The realtime class: what a latency-bound client would use (the naive server has no classes).
    frames = [bytes(f) for f in encode_request(1, model=model, klass="realtime", inputs={name: x})]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    samples = []
    try:
        for i in range(runs + 50):
            start = time.perf_counter_ns()
            sock.send_multipart(frames)
            if not sock.poll(10_000):
                raise RuntimeError(f"no reply from {endpoint}")
            sock.recv_multipart()
            if i >= 50:  # the first replies warm the path
                samples.append((time.perf_counter_ns() - start) / 1000)
    finally:
        sock.close()
    return percentiles(samples)


def serve_echo(endpoint: str) -> None:
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.bind(endpoint)
    while True:
        sock.send_multipart(sock.recv_multipart())


def serve_naive(endpoint: str) -> None:
    """The simplest correct server: everything on one thread, no queues."""
    import msgpack
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sessions = {m: ort.InferenceSession(str(ROOT / "engines" / m / "model.onnx"), options) for m in MODELS}
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.bind(endpoint)
    while True:
        identity, header_frame, *payloads = sock.recv_multipart()
        header = msgpack.unpackb(header_frame)
        spec = header["inputs"][0]
        x = np.frombuffer(payloads[0], dtype=spec["dtype"]).reshape(spec["shape"])
        (y,) = sessions[header["model"]].run(None, {spec["name"]: x})
        reply = {
            "v": 1,
            "id": header["id"],
            "status": "OK",
            "outputs": [{"name": "out", "dtype": "float32", "shape": list(y.shape)}],
        }
        sock.send_multipart([identity, msgpack.packb(reply), y.tobytes()])


def _helper_server(mode: str, endpoint: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, __file__, f"--serve-{mode}", endpoint])
    time.sleep(2.0 if mode == "naive" else 0.5)
    return process


def triton(python: str, runs: int, duration: float) -> dict[str, Any]:
    import sysconfig

    env = {**os.environ, "LD_LIBRARY_PATH": str(sysconfig.get_config_var("LIBDIR"))}
    script = str(ROOT / "bench" / "compare_triton.py")
    done = subprocess.run(
        [python, script, "--runs", str(runs), "--duration", str(duration)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def overload(endpoint: str, duration: float, model_inputs: dict[str, Any]) -> dict[str, Any]:
    """Realtime alone, bulk alone at saturation, then both with bulk at 3x capacity."""
    from edged.client import Client

    with Client(endpoint) as client:
        client.infer("cnn-heavy", {"image": np.zeros((1, 3, 64, 64), np.float32)})
    heavy_ms = in_process("cnn-heavy", 100)["p50"] / 1000
    capacity = 1000 / heavy_ms
    realtime = Stream("realtime", "mlp-light", 50, 20.0)
    scenarios = {
        "realtime_alone": [realtime],
        "bulk_saturated": [Stream("bulk", "cnn-heavy", 1.5 * capacity, 5000.0)],
        "flood": [realtime, Stream("bulk", "cnn-heavy", 3 * capacity, 5000.0)],
    }
    results: dict[str, Any] = {"heavy_capacity_rps": round(capacity, 1)}
    for name, streams in scenarios.items():
        rows = run_load(endpoint, streams, model_inputs, duration, progress=progress_to_stderr)
        sys.stderr.write("\n")
        print(f"\n{name}:\n{format_table(rows)}")
        results[name] = rows
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve-echo", metavar="ENDPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--serve-naive", metavar="ENDPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="fewer requests, shorter overload runs")
    parser.add_argument("--write-docs", action="store_true", help="write docs/benchmarks.json")
    parser.add_argument("--triton-python", help="a Python with nvidia-pytriton, to add Triton to the comparison")
    args = parser.parse_args()
    if args.serve_echo:
        return serve_echo(args.serve_echo)
    if args.serve_naive:
        return serve_naive(args.serve_naive)

    runs = {"mlp-light": 500 if args.quick else 3000, "cnn-heavy": 100 if args.quick else 500}
    duration = 5.0 if args.quick else 20.0
    results: dict[str, Any] = {"machine": _machine(), "runs": runs, "overload_duration_s": duration, "unloaded": {}}
    with tempfile.TemporaryDirectory(prefix="edged-cmp-") as folder:
        for model in MODELS:
            row = results["unloaded"].setdefault(model, {})
            row["in_process"] = in_process(model, runs[model])
            for mode in ("echo", "naive"):
                endpoint = f"ipc://{folder}/{mode}.sock"
                server = _helper_server(mode, endpoint)
                try:
                    row[f"zmq_{mode}" if mode == "echo" else "naive_server"] = round_trips(endpoint, model, runs[model])
                finally:
                    server.kill()
        endpoint = f"ipc://{folder}/edged.sock"
        with DaemonProcess([endpoint]) as daemon:
            daemon.wait_serving()
            for model in MODELS:
                results["unloaded"][model]["edged"] = round_trips(endpoint, model, runs[model])
            inputs = {m: [{"name": n, "dtype": "float32", "shape": [-1, *s[1:]]}] for m, (n, s) in MODELS.items()}
            results["overload"] = overload(endpoint, duration, inputs)
    if args.triton_python:
        results["triton"] = triton(args.triton_python, runs["mlp-light"], duration)
        for model, figures in results["triton"]["latency_us"].items():
            results["unloaded"][model]["pytriton"] = figures
    print(_unloaded_table(results["unloaded"]))
    print(json.dumps(_verdicts(results), indent=2))
    if args.write_docs:
        results["verdicts"] = _verdicts(results)
        (ROOT / "docs" / "benchmarks.json").write_text(json.dumps(results, indent=2) + "\n")


def _unloaded_table(unloaded: dict[str, Any]) -> str:
    lines = ["", f"{'model':<10} {'path':<13} {'p50 us':>8} {'p99 us':>8} {'p99.9 us':>9}"]
    for model, row in unloaded.items():
        for path, figures in row.items():
            lines.append(f"{model:<10} {path:<13} {figures['p50']:>8} {figures['p99']:>8} {figures['p999']:>9}")
    return "\n".join(lines)


def _verdicts(results: dict[str, Any]) -> dict[str, Any]:
    light = results["unloaded"]["mlp-light"]
    floor = light["in_process"]["p50"] + light["zmq_echo"]["p50"]
    over = results["overload"]
    alone = over["realtime_alone"][0]
    flood_rt, flood_bulk = over["flood"]
    best_bulk = over["bulk_saturated"][0]["goodput_rps"]
    verdicts = {
        "light_p50_overhead_beyond_floor_us": round(light["edged"]["p50"] - floor, 1),
        "light_p50_vs_naive": round(light["edged"]["p50"] / light["naive_server"]["p50"], 3),
        "light_p99_vs_naive": round(light["edged"]["p99"] / light["naive_server"]["p99"], 3),
        "flood_realtime_ok_fraction": round(flood_rt["ok_fraction"], 4),
        "flood_realtime_p99_vs_alone": round(flood_rt["latency_us"]["p99"] / alone["latency_us"]["p99"], 2),
        "flood_lost_requests": flood_rt["lost"] + flood_bulk["lost"],
        "flood_shed_in_daemon_max_us": flood_bulk["shed_in_daemon_us_max"],
        "flood_bulk_goodput_vs_best": round(flood_bulk["goodput_rps"] / best_bulk, 3) if best_bulk else None,
    }
    if "triton" in results:
        for model in MODELS:
            row = results["unloaded"][model]
            verdicts[f"{model}_p99_triton_over_edged"] = round(row["pytriton"]["p99"] / row["edged"]["p99"], 1)
        verdicts["flood_bulk_goodput_vs_triton"] = round(
            flood_bulk["goodput_rps"] / results["triton"]["heavy_throughput_rps"], 2
        )
    return verdicts


def _machine() -> dict[str, Any]:
    import onnxruntime

    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "onnxruntime": onnxruntime.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


if __name__ == "__main__":
    main()
