"""Every name edged's GPU code reads from cuda-python and TensorRT exists in the real
wheels, which import without a GPU (cuda-bindings' runtime and driver modules, and
TensorRT's lean runtime, `tensorrt_lean`). A misspelt attribute would otherwise be
found only on a lent GPU machine, in its first minutes. Skipped, with the reason,
where the wheels are not installed (.ci/run installs them)."""

from __future__ import annotations

import ast
from typing import Any

import pytest
from support import REPO_ROOT

ROOT = REPO_ROOT


def used_names(path: str, receivers: set[str]) -> set[str]:
    """The dotted attribute chains read off any of `receivers` in the file, e.g.
    "cudaDeviceAttr.cudaDevAttrCanMapHostMemory" off "rt"."""
    chains = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        parts, value = [node.attr], node.value
        while isinstance(value, ast.Attribute) and ast.unparse(value) not in receivers:
            parts.append(value.attr)
            value = value.value
        if ast.unparse(value) in receivers:
            chains.add(".".join(reversed(parts)))
    # A chain read whole also reads its prefixes; keep the longest.
    return {c for c in chains if not any(other.startswith(c + ".") for other in chains)}


def missing(real: Any, chains: set[str]) -> list[str]:
    gone = []
    for chain in sorted(chains):
        target = real
        for part in chain.split("."):
            if not hasattr(target, part):
                gone.append(chain)
                break
            target = getattr(target, part)
    return gone


def cuda_bindings() -> tuple[Any, Any]:
    bindings = pytest.importorskip("cuda.bindings", reason="cuda-python is not installed (pip install cuda-python)")
    from cuda.bindings import driver, runtime

    return bindings and runtime, driver


RUNTIME_USERS = (
    "edged/backends/cuda.py",
    "edged/backends/cuda_calls.py",
    "edged/backends/cuda_memory.py",
    "edged/backends/cuda_ipc.py",
    "bench/gpu_check_stream.py",
    "bench/gpu_check_ipc.py",
    "bench/gpu_check_preflight.py",
)
DRIVER_USERS = (
    "edged/backends/cuda.py",
    "edged/backends/cuda_calls.py",
    "edged/backends/cuda_ipc.py",
    "edged/backends/green.py",
)


@pytest.mark.parametrize("path", RUNTIME_USERS)
def test_every_cuda_runtime_name_exists_in_cuda_bindings(path: str) -> None:
    runtime, _ = cuda_bindings()
    chains = used_names(path, {"rt", "runtime()"})
    assert chains, f"{path} reads nothing off the runtime: the scan is out of date"
    assert missing(runtime, chains) == []


@pytest.mark.parametrize("path", DRIVER_USERS)
def test_every_cuda_driver_name_exists_in_cuda_bindings(path: str) -> None:
    _, driver = cuda_bindings()
    chains = used_names(path, {"driver", "driver_api()"})
    assert chains, f"{path} reads nothing off the driver: the scan is out of date"
    assert missing(driver, chains) == []


def test_every_tensorrt_runtime_name_exists_in_tensorrt_lean() -> None:
    trt = pytest.importorskip("tensorrt_lean", reason="TensorRT's lean runtime is not installed (tensorrt-lean-cu13)")
    # The backend, its runner, and the engines it shares (one per file: edged.backends.tensorrt_engines).
    paths = ("edged/backends/tensorrt.py", "edged/backends/tensorrt_runner.py", "edged/backends/tensorrt_engines.py")
    for receivers, real in (
        ({"trt"}, trt),
        ({"runtime"}, trt.Runtime),
        ({"engine", "self._engine"}, trt.ICudaEngine),
        ({"context", "self._context"}, trt.IExecutionContext),
    ):
        chains = set().union(*(used_names(path, receivers) for path in paths)) - {"__version__"}
        assert chains, f"{paths} read nothing off {receivers}: the scan is out of date"
        assert missing(real, chains) == [], receivers
