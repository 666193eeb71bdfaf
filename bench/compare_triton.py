"""The Triton side of compare.py: the demo models served by a real tritonserver through
PyTriton, measured with its own client. Runs in an environment of its own:

    python3 -m venv /tmp/tri && /tmp/tri/bin/pip install nvidia-pytriton onnxruntime numpy
    LD_LIBRARY_PATH=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))') \\
        /tmp/tri/bin/python bench/compare_triton.py --runs 1000 --duration 10

(Triton's Python backend stub needs the interpreter's shared library on the path.)
Prints one JSON object: closed-loop latency percentiles per model, and the heavy
model's sustained throughput with dynamic batching under many concurrent clients.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from pytriton.client import ModelClient
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"mlp-light": ("x", (64,), "scores"), "cnn-heavy": ("image", (3, 64, 64), "logits")}


def _infer_fn(model: str):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(ROOT / "engines" / model / "model.onnx"), options)
    input_name, _, output_name = MODELS[model]

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        (out,) = session.run(None, {input_name: inputs[input_name]})
        return {output_name: out}

    return infer


def latency(url: str, model: str, runs: int) -> dict[str, float]:
    input_name, shape, _ = MODELS[model]
    x = np.random.default_rng(0).standard_normal((1, *shape)).astype(np.float32)
    samples = []
    with ModelClient(url, model) as client:
        for i in range(runs + 50):
            start = time.perf_counter_ns()
            client.infer_batch(**{input_name: x})
            if i >= 50:
                samples.append((time.perf_counter_ns() - start) / 1000)
    values = np.array(samples)
    return {k: round(float(np.percentile(values, q)), 1) for k, q in (("p50", 50), ("p99", 99), ("p999", 99.9))}


def throughput(url: str, model: str, clients: int, duration: float) -> float:
    input_name, shape, _ = MODELS[model]
    x = np.zeros((1, *shape), np.float32)
    done = [0] * clients
    end = time.monotonic() + duration

    def loop(index: int) -> None:
        with ModelClient(url, model) as client:
            while time.monotonic() < end:
                client.infer_batch(**{input_name: x})
                done[index] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return round(sum(done) / duration, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    config = TritonConfig(http_port=18000, grpc_port=18001, metrics_port=18002, log_verbose=0)
    with Triton(config=config) as triton:
        for model, (input_name, shape, output_name) in MODELS.items():
            triton.bind(
                model_name=model,
                infer_func=_infer_fn(model),
                inputs=[Tensor(name=input_name, dtype=np.float32, shape=shape)],
                outputs=[Tensor(name=output_name, dtype=np.float32, shape=(10,))],
                config=ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=500)),
            )
        triton.run()
        url = "grpc://127.0.0.1:18001"
        result = {
            "latency_us": {
                model: latency(url, model, args.runs if model == "mlp-light" else args.runs // 5) for model in MODELS
            },
            "heavy_throughput_rps": throughput(url, "cnn-heavy", args.clients, args.duration),
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
