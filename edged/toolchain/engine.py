"""TensorRT engine builds: a strongly typed network from a model's ONNX of one
precision (Q/DQ INT8/FP8, FP16, BF16 or FP32), an optimization profile from its
dynamic batch, a timing cache reused across builds, and a manifest entry.

Written against TensorRT 10/11's documented Python API; NOT YET RUN: no machine
here has TensorRT's builder (it ships on NVIDIA's own package index). What runs here
is every check before TensorRT: the model, the precision, the batch range, the GPU.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.models.engines import FP8_MIN_CC, EngineRecord, ShapeRange
from edged.models.manifest import ModelFolder
from edged.models.repository import sha256_of
from edged.toolchain import Progress

PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")
BUILD_HINT = (
    "TensorRT's builder is not installed: `pip install tensorrt` "
    "(from NVIDIA's own package index, which must be reachable), on a machine with an NVIDIA GPU"
)


class EngineBuildError(RuntimeError):
    """A build that cannot run here; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class BatchRange:
    min: int = 1
    opt: int = 1
    max: int = 16

    def check(self) -> None:
        if not 1 <= self.min <= self.opt <= self.max:
            raise EngineBuildError(
                f"batch sizes must satisfy 1 <= min <= opt <= max; got {self.min}, {self.opt}, {self.max}"
            )


def profile_shapes(folder: ModelFolder, batch: BatchRange) -> dict[str, ShapeRange]:
    """min/opt/max per input: the batch dimension from `batch`, every other one fixed."""
    batch.check()
    shapes = {}
    for spec in folder.inputs:
        rest = spec.shape[1:]
        if any(d < 0 for d in rest):
            raise EngineBuildError(f"input {spec.name} has a dynamic dimension besides the batch: {list(spec.shape)}")
        if spec.shape[0] >= 0:  # a fixed batch: the profile is that one shape
            fixed = tuple(spec.shape)
            shapes[spec.name] = ShapeRange(fixed, fixed, fixed)
        else:
            shapes[spec.name] = ShapeRange((batch.min, *rest), (batch.opt, *rest), (batch.max, *rest))
    return shapes


def build_engine(
    folder: ModelFolder,
    precision: str,
    batch: BatchRange,
    *,
    version_compatible: bool = False,
    timing_cache: Path | None = None,
    progress: Progress = lambda _: None,
) -> EngineRecord:
    if precision not in PRECISIONS:
        raise EngineBuildError(f"precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    source = folder.source() if precision == "fp32" else folder.onnx_of(precision)
    shapes = profile_shapes(folder, batch)
    trt, device = _tensorrt_and_gpu()
    if precision == "fp8" and device.compute_capability < FP8_MIN_CC:
        raise EngineBuildError(
            f"FP8 engines need compute capability 8.9 or newer; {device.name} has "
            "{}.{}: build int8 or fp16 here".format(*device.compute_capability)
        )
    progress(f"parsing {source.name} into a strongly typed network (TensorRT {trt.__version__}, {device.name})")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    # Strongly typed: every tensor keeps the type its ONNX gives it; no precision flags.
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(source)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineBuildError(f"TensorRT cannot parse {source}: {errors}")
    config = builder_config(trt, builder, shapes, version_compatible)
    cache_blob = timing_cache.read_bytes() if timing_cache and timing_cache.is_file() else b""
    config.set_timing_cache(config.create_timing_cache(cache_blob), False)
    config.progress_monitor = _monitor(trt, progress)
    started = time.monotonic()
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EngineBuildError(f"TensorRT could not build {source.name} (see the TensorRT log above)")
    progress(f"built in {time.monotonic() - started:.1f} s")
    if timing_cache:
        timing_cache.write_bytes(bytes(config.get_timing_cache().serialize()))
    gpu = re.sub(r"[^a-z0-9]+", "-", device.name.lower()).strip("-")
    target = folder.path / f"{source.stem}.{gpu}.trt{trt.__version__}.plan"
    target.write_bytes(bytes(plan))
    record = EngineRecord(
        precision=precision,
        file=target.name,
        sha256=sha256_of(target),
        source_file=source.name,
        source_sha256=sha256_of(source),
        tensorrt_version=trt.__version__,
        version_compatible=version_compatible,
        gpu_name=device.name,
        compute_capability=device.compute_capability,
        profiles=(shapes,),
        built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    folder.put_variant(record.to_manifest(), same=("backend", "file"))
    return record


def builder_config(trt: Any, builder: Any, shapes: dict[str, ShapeRange], version_compatible: bool) -> Any:
    """The build's settings: one optimization profile, no auxiliary streams."""
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name, bounds in shapes.items():
        profile.set_shape(name, bounds.min, bounds.opt, bounds.max)
    config.add_optimization_profile(profile)
    if version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    # TensorRT may run branches of an engine on auxiliary streams it creates at the
    # default priority; with none, a lane's priority stream carries all its work.
    config.max_aux_streams = 0
    return config


def _tensorrt_and_gpu() -> tuple[Any, Any]:
    """TensorRT's builder and the GPU it builds for; the device is checked first."""
    from edged.backends.cuda import cuda_available, device_info

    reason = cuda_available()
    if reason is not None:
        raise EngineBuildError(f"building a TensorRT engine needs an NVIDIA GPU, and {reason}")
    try:
        import tensorrt as trt
    except ImportError:
        raise EngineBuildError(BUILD_HINT) from None
    return trt, device_info(0)


def _monitor(trt: Any, progress: Progress) -> Any:
    """Report the builder's phases (IProgressMonitor, TensorRT 10 on): builds take minutes."""

    class Monitor(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            progress(f"  {phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name: str, step: int) -> bool:
            return True  # never cancel

        def phase_finish(self, phase_name: str) -> None:
            pass

    return Monitor()
