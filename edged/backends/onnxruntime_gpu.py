"""What onnxruntime-gpu needs before its CUDA sessions serve: one build of ONNX Runtime
installed, CUDA's libraries loaded, and each session created so that it runs on the GPU
or fails saying why.

ONNX Runtime's own defaults hide three failures, each seen in a desk check of the
onnxruntime-gpu 1.31 wheel, then guarded against on an H200 (docs/benchmarks-gpu.md):
- `preload_dlls()` looks for cuBLAS and cuDNN in the `nvidia` wheels beside onnxruntime
  and on the loader's path only; installed elsewhere (`pip install --target`), it finds
  neither, and the CUDA provider then fails to load without raising: the session lands
  on the CPU. cuDNN is opened lazily, so a model with convolutions can fail later still.
  So `load_cuda_libraries` also looks in every `nvidia` package folder on sys.path and
  checks that both load, before the first session.
- When creating the CUDA provider raises (a bad stream, a cuDNN handle error), the Python
  layer prints the error to stdout and retries on the CPU: `enable_fallback=0` makes it
  raise instead, so the error is reported as it is.
- Nodes without a CUDA kernel, or shape computations the provider leaves to the CPU, run
  on the CPU silently: `session.disable_cpu_ep_fallback` refuses that, and a model so
  refused is loaded again with its CPU nodes allowed and a warning that says so.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from edged.backends import BackendError
from edged.config.classes import ClassConfig

log = logging.getLogger("edged")

PROVIDER = "CUDAExecutionProvider"
# Both builds in one environment (an install of the `cpu` extra, then the `gpu` one): take
# both out, since each removes files of the other, and put the GPU build back alone.
GPU_INSTALL = "pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'onnxruntime-gpu>=1.20'"
CPU_NODES_REFUSED = "fallback to CPU EP has been explicitly disabled"
ORT_LOG_LEVEL = "EDGED_ORT_LOG_LEVEL"


def runtime_conflict() -> str | None:
    """Why the installed ONNX Runtime cannot be trusted with CUDA, or None: both of its
    distributions installed in one site folder write one `onnxruntime` package, so the
    CUDA provider is there or not depending on which was installed last. (In different
    folders, the first on sys.path is imported, and the provider check tells.)"""
    found = {}
    for name in ("onnxruntime", "onnxruntime-gpu"):
        try:
            found[name] = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            pass
    if len(found) < 2 or len({str(dist.locate_file("")) for dist in found.values()}) > 1:
        return None
    both = " and ".join(f"{name} {dist.version}" for name, dist in found.items())
    return f"{both} are both installed, into one onnxruntime package folder that only one can own: {GPU_INSTALL}"


def cuda_libraries(cuda_major: int) -> dict[str, tuple[str, ...]]:
    """The shared libraries the CUDA provider opens, by what they are, in load order (cuBLAS
    needs cuBLASLt first); cuDNN's sub-libraries are opened only at the first convolution."""
    return {
        "the CUDA runtime": (f"libcudart.so.{cuda_major}",),
        "cuBLAS": (f"libcublasLt.so.{cuda_major}", f"libcublas.so.{cuda_major}"),
        # cuRAND: the provider links it (for its random ops), so it fails to load without it.
        "cuRAND": ("libcurand.so.10",),
        "cuDNN": ("libcudnn.so.9", "libcudnn_graph.so.9", "libcudnn_ops.so.9", "libcudnn_cnn.so.9"),
    }


def nvidia_folders() -> list[Path]:
    """The `lib` folders of every `nvidia` wheel on sys.path (nvidia/cu13/lib, nvidia/cudnn/lib,
    ...), wherever its site folder is: the machine's own, or one on PYTHONPATH."""
    found = []
    for entry in sys.path:
        root = Path(entry or ".") / "nvidia"
        if root.is_dir():
            found += sorted(lib for lib in root.glob("*/lib") if lib.is_dir())
    return found


def load_cuda_libraries(ort: Any) -> None:
    """Load the CUDA runtime, cuBLAS and cuDNN for ONNX Runtime's CUDA provider, before its
    first session; raise BackendError naming each one that cannot be loaded.

    A library loaded here by its full path is found by the provider later by its name (the
    dynamic loader matches the name against those already loaded)."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        preload()  # the nvidia wheels beside onnxruntime, and the loader's path
    folders = nvidia_folders()
    missing = []
    for what, names in cuda_libraries(cuda_major(ort)).items():
        for name in names:
            error = _open(name, folders)
            if error:
                missing.append(f"{what} ({error})")
                break
    if missing:
        where = ", ".join(str(f) for f in folders) or "none on sys.path"
        raise BackendError(
            f"ONNX Runtime's CUDA provider needs {' and '.join(missing)}; nvidia library folders looked in: "
            f"{where}; install them with pip install 'onnxruntime-gpu[cuda,cudnn]', or put their folders on "
            "LD_LIBRARY_PATH"
        )


def open_library(name: str) -> None:
    """dlopen `name` (a name the loader searches for, or a path); OSError when it cannot."""
    ctypes.CDLL(name)


def _open(name: str, folders: list[Path]) -> str:
    """'' when `name` loads, by name or from one of `folders`; else the loader's error."""
    try:
        open_library(name)
        return ""
    except OSError as exc:
        error = str(exc)
    for folder in folders:
        if (folder / name).is_file():
            try:
                open_library(str(folder / name))
                return ""
            except OSError as exc:
                error = str(exc)
    return error


def cuda_major(ort: Any) -> int:
    """The CUDA major version onnxruntime-gpu was built for (13 for the 1.31 wheels)."""
    version = str(getattr(ort, "cuda_version", "") or "13")
    return int(version.split(".")[0])


@dataclass(frozen=True, slots=True)
class CudaSession:
    session: Any
    cpu_nodes: bool  # some of its nodes run on the CPU: shape computations, or ops without a CUDA kernel


def create_session(
    ort: Any, path: Path, name: str, lane: ClassConfig, provider: dict[str, str], shared: Mapping[str, Any]
) -> CudaSession:
    """A session of the model at `path` on the CUDA provider alone, taking the `shared`
    initializers (OrtValues, by name) in place of its own, or BackendError with ONNX
    Runtime's own reason; a model with nodes left to the CPU loads with a warning."""
    try:
        return CudaSession(_session(ort, path, name, lane, provider, shared, cpu_nodes=False), cpu_nodes=False)
    except BackendError:
        raise
    except Exception as exc:
        if CPU_NODES_REFUSED not in str(exc):
            raise BackendError(f"{name}: ONNX Runtime's CUDA provider failed to create the session: {exc}") from exc
    log.warning(
        "%s: some of its nodes run on the CPU, not the GPU (ops without a CUDA kernel, or shape computations "
        "ONNX Runtime keeps there): each call copies between them",
        name,
    )
    try:
        return CudaSession(_session(ort, path, name, lane, provider, shared, cpu_nodes=True), cpu_nodes=True)
    except BackendError:
        raise
    except Exception as exc:
        raise BackendError(f"{name}: ONNX Runtime's CUDA provider failed to create the session: {exc}") from exc


def _session(
    ort: Any,
    path: Path,
    name: str,
    lane: ClassConfig,
    provider: dict[str, str],
    shared: Mapping[str, Any],
    cpu_nodes: bool,
) -> Any:
    options = session_options(ort, lane, cpu_nodes)
    for initializer, value in shared.items():
        options.add_initializer(initializer, value)  # the session points into `value`'s memory: it must outlive it
    session = ort.InferenceSession(str(path), options, providers=[(PROVIDER, provider)], enable_fallback=0)
    placed = session.get_providers()[0]
    if placed != PROVIDER:
        # A CUDA library that fails to load drops the provider without raising.
        raise BackendError(
            f"{name}: ONNX Runtime put the session on {placed}, not {PROVIDER}, so its CUDA provider did not load "
            "(python -c 'import onnxruntime as o; o.preload_dlls(); o.print_debug_info()' shows what it finds)"
        )
    return session


def ort_log_level() -> int:
    """ONNX Runtime's session log level: 3 (errors) unless EDGED_ORT_LOG_LEVEL says otherwise;
    1 keeps its info and warnings, which say when a CUDA graph is captured and when a session
    copies a shared initializer ("Cannot use user supplied initializer"): the GPU
    verification sets it so that its daemon logs show both."""
    text = os.environ.get(ORT_LOG_LEVEL, "3")
    if text not in ("0", "1", "2", "3", "4"):
        raise BackendError(f"{ORT_LOG_LEVEL}={text!r}: ONNX Runtime's log levels are 0 (verbose) to 4 (fatal)")
    return int(text)


def session_options(ort: Any, lane: ClassConfig, cpu_nodes: bool) -> Any:
    """The lane's session options: its `threads` for what runs on the CPU, pools that sleep
    rather than spin (a GPU call's thread waits on the device, and spinning pools would
    take the cores the other lanes and the socket loop need), and no node on the CPU
    unless `cpu_nodes`."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = ort_log_level()
    options.intra_op_num_threads = lane.threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "0" if cpu_nodes else "1")
    return options
