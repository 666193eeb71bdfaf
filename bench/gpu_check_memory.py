"""bench/gpu_checks.py memory: a daemon serves with the card full (see there).
Ran on an NVIDIA H200 and an NVIDIA H100 (2026-11-27; docs/benchmarks-gpu.md)."""

from __future__ import annotations

import tempfile
import tomllib
from pathlib import Path
from typing import Any

from gpu_checks import MIB, ROOT, CpuReference, random_inputs, worst, write

from edged.backends.cuda import CudaError
from edged.config import ClassConfig, parse_config
from edged.loadgen.gpu_memory_check import fill, format_memory_table, format_weights_table, memory_configs, weights_rows
from edged.models.repository import discover

LEAVE_FREE = 64 * MIB  # what the filler leaves of the card


def every_request(client: Any, classes: tuple[ClassConfig, ...], cpu: CpuReference) -> list[str]:
    """Every class, every model, every batch size up to the class's max_batch: the failures."""
    failures, models = [], discover(ROOT / "engines", "onnxruntime")
    for klass in classes:
        for model in models:
            for rows in range(1, (klass.max_batch if model.signature.batchable else 1) + 1):
                inputs = random_inputs(model, rows, seed=rows)
                where = f"{klass.name} {model.name} x{rows}"
                try:
                    reply = client.infer(model.name, inputs, klass=klass.name, deadline_ms=30_000)
                except Exception as exc:  # an error reply is what this check looks for
                    failures.append(f"{where}: {exc!r}")
                    continue
                got = [reply[name] for name in model.signature.output_names]
                error, bound = worst(model, got, cpu.run(model, inputs))
                if not error <= bound:
                    failures.append(f"{where}: error {error:.3g} above the TF32 bound {bound:.3g}")
    return failures


def under_pressure(name: str, text: str, cpu: CpuReference, out: Path) -> dict[str, Any]:
    """One daemon config of the memory check: its lanes, the filler, the requests."""
    from edged.backends import cuda
    from edged.client import Client
    from edged.loadgen.launch import DaemonProcess

    with tempfile.TemporaryDirectory(prefix="edged-mem-") as folder:
        config = Path(folder) / "edged.toml"
        config.write_text(text)
        classes = parse_config(tomllib.loads(text), base_dir=Path(folder)).classes
        endpoint = f"ipc://{folder}/d.sock"
        log = Path(folder) / "daemon.log"
        try:
            with DaemonProcess([endpoint], config=config, log_path=log) as daemon:
                daemon.wait_serving(timeout_s=300)
                with Client(endpoint, timeout_ms=60_000) as client:
                    stats = client.stats()
                    lanes = [lane_memory(name, lane, figures["gpu"]) for lane, figures in stats["classes"].items()]
                    models = client.models()
                    weights = weights_rows(name, stats, models)
                    cuda.set_device(0)
                    free_before = cuda.memory_info()[0]
                    chunks = fill(allocate, lambda: cuda.memory_info()[0], LEAVE_FREE)
                    try:
                        left = cuda.memory_info()[0]
                        failures = every_request(client, classes, cpu)
                        state = client.health()["state"]
                    finally:
                        for buffer, _ in chunks:
                            buffer.close()
                    if state != "serving":
                        failures.append(f"health says {state!r} after the requests")
                code = daemon.stop()
            if code != 0:
                failures.append(f"the daemon exited with code {code} on SIGTERM")
        finally:
            slug = name.replace(" ", "-")
            if log.exists():
                (out / f"gpu-checks-memory-{slug}.log").write_bytes(log.read_bytes())
    taken = sum(size for _, size in chunks)
    return {
        "config": name,
        "lanes": lanes,
        "weights": weights,
        "cpu_nodes": {m["name"]: m.get("cpu_nodes") for m in models},
        "free_before": free_before,
        "filler_bytes": taken,
        "left_bytes": left,
        "failures": failures,
    }


def lane_memory(config: str, lane: str, gpu: dict[str, Any]) -> dict[str, Any]:
    return {
        "config": config,
        "lane": lane,
        "planned_bytes": gpu["planned_bytes"],
        "measured_bytes": gpu["measured_bytes"],
        "context_bytes": gpu["context_bytes"],
    }


def allocate(size: int) -> Any | None:
    from edged.backends import cuda

    try:
        return cuda.DeviceBuffer(size)
    except CudaError:  # out of memory (not sticky): try a smaller chunk
        return None


def run(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    cpu, results = CpuReference(), []
    for name, text in memory_configs().items():
        try:
            results.append(under_pressure(name, text, cpu, out))
        except Exception as exc:  # one config's failure must not cost the other's result
            error = f"{type(exc).__name__}: {exc}"
            results.append({"config": name, "lanes": [], "weights": [], "error": error, "failures": [error]})
        write(out, "memory", {"leave_free_bytes": LEAVE_FREE, "runs": results})
    print(format_memory_table([lane for result in results for lane in result["lanes"]]))
    print(format_weights_table([row for result in results for row in result["weights"]]))
    for result in results:
        if "error" in result:
            print(f"{result['config']}: FAILED: {result['error']}")
            continue
        print(
            f"{result['config']}: filler took {result['filler_bytes'] / MIB:.0f} MiB of "
            f"{result['free_before'] / MIB:.0f} MiB free, leaving {result['left_bytes'] / MIB:.1f} MiB; "
            f"failures: {result['failures'] or 'none'}"
        )
    failures = sum(len(result["failures"]) for result in results)
    outcome = "FAIL" if failures else "PASS"
    write(out, "memory", {"leave_free_bytes": LEAVE_FREE, "runs": results, "outcome": outcome})
    if failures:
        print(f"memory: FAIL: {failures} requests or stops failed with the card full (see above)")
        return 1
    print("memory: PASS: every class, model and batch size answered OK and equal to the CPU with ~64 MiB left")
    return 0
