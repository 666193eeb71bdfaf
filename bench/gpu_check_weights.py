"""bench/gpu_checks.py weights: each model's weights held once on the device (see there).
Ran on an NVIDIA H200 and an NVIDIA H100 (2026-11-27; docs/benchmarks-gpu.md)."""

from __future__ import annotations

import tempfile
import tomllib
from pathlib import Path
from typing import Any

import onnx
from gpu_checks import MIB, CpuReference, random_inputs, worst, write

from edged.config import parse_config
from edged.loadgen.gpu_memory_check import format_weights_table, weights_config, weights_once, weights_rows
from edged.loadgen.large_model import write_matmuls
from edged.models.onnx_import import write_folder
from edged.models.repository import ModelEntry, entries_of

SIDE = 4096  # three 4096 x 4096 float32 MatMuls: 192 MiB, far above what a lane takes of its own


def serve(folder: Path, model: ModelEntry, out: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """A daemon on the large model: its stats and models replies, and what failed (one
    request per class, each against the CPU)."""
    from edged.client import Client
    from edged.loadgen.launch import DaemonProcess

    text = weights_config(folder / "repo")
    config = folder / "edged.toml"
    config.write_text(text)
    classes = parse_config(tomllib.loads(text), base_dir=folder).classes
    endpoint, log = f"ipc://{folder}/d.sock", folder / "daemon.log"
    failures, cpu = [], CpuReference()
    try:
        with DaemonProcess([endpoint], config=config, log_path=log) as daemon:
            daemon.wait_serving(timeout_s=300)
            with Client(endpoint, timeout_ms=60_000) as client:
                stats, models = client.stats(), client.models()
                for klass in classes:
                    inputs = random_inputs(model, 2, seed=1)
                    reply = client.infer(model.name, inputs, klass=klass.name, deadline_ms=30_000)
                    error, bound = worst(model, [reply["y"]], cpu.run(model, inputs))
                    if not error <= bound:
                        failures.append(f"{klass.name}: error {error:.3g} above the TF32 bound {bound:.3g}")
            if (code := daemon.stop()) != 0:
                failures.append(f"the daemon exited with code {code} on SIGTERM")
    finally:
        if log.exists():
            (out / "gpu-checks-weights.log").write_bytes(log.read_bytes())
    return stats, models, failures


def run(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edged-weights-") as name:
        folder = Path(name)
        source = folder / "matmuls.onnx"
        write_matmuls(source, SIDE, seed=1)
        manifest = write_folder(source, onnx.load(str(source)), folder / "repo", "matmuls", [], {}, False)
        model = entries_of(manifest, "onnxruntime")[0]
        weights = model.variant.path.stat().st_size / MIB  # read while the folder exists
        try:
            stats, models, failures = serve(folder, model, out)
        except Exception as exc:  # recorded, with the daemon's log kept beside
            write(out, "weights", {"side": SIDE, "outcome": "FAIL", "error": f"{type(exc).__name__}: {exc}"})
            print(f"weights: FAIL: {type(exc).__name__}: {exc}")
            return 1
    rows = weights_rows("default classes", stats, models)
    print(format_weights_table(rows))
    failures += weights_once(rows)
    cpu_nodes = {m["name"]: m.get("cpu_nodes") for m in models}
    outcome = "FAIL" if failures else "PASS"
    write(
        out, "weights", {"side": SIDE, "rows": rows, "cpu_nodes": cpu_nodes, "failures": failures, "outcome": outcome}
    )
    if failures:
        print("weights: FAIL: " + "; ".join(failures))
        return 1
    print(f"weights: PASS: {weights:.0f} MiB of weights on the device once, and no lane holds a copy of its own")
    return 0
