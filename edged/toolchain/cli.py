"""`edged build`: quantize, convert and engine, each one step of the build chain."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from edged.cli.arguments import positive_int
from edged.config import default_repository

if TYPE_CHECKING:
    from edged.models.manifest import ModelFolder

STARTED = time.monotonic()


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    build = commands.add_parser("build", help="quantize, convert or build TensorRT engines into the model repository")
    build.set_defaults(run=run)
    steps = build.add_subparsers(dest="step", required=True)

    quantize = steps.add_parser("quantize", help="INT8/FP8 Q/DQ ONNX, checked against FP32 on held-out samples")
    _model(quantize)
    quantize.add_argument("--precision", choices=("int8", "fp8"), required=True)
    quantize.add_argument("--calibration", type=Path, help="folder of .npy/.npz samples (default: seeded N(0,1))")
    quantize.add_argument(
        "--samples", type=positive_int, default=256, help="calibration samples drawn when no folder is given"
    )
    quantize.add_argument("--held-out", type=positive_int, default=32, help="held-out samples of the accuracy report")
    quantize.add_argument("--quantizer", choices=("onnxruntime", "modelopt"), default="onnxruntime")
    quantize.set_defaults(step_run=_quantize)

    convert = steps.add_parser("convert", help="FP16/BF16 ONNX for TensorRT's strongly typed builds")
    _model(convert)
    convert.add_argument("--precision", choices=("fp16", "bf16"), required=True)
    convert.set_defaults(step_run=_convert)

    engine = steps.add_parser("engine", help="a TensorRT engine for this GPU (needs TensorRT and a GPU)")
    _model(engine)
    engine.add_argument("--precision", choices=("fp32", "fp16", "bf16", "int8", "fp8"), required=True)
    engine.add_argument("--min-batch", type=positive_int, default=1)
    engine.add_argument("--opt-batch", type=positive_int, default=1)
    engine.add_argument("--max-batch", type=positive_int, default=16)
    engine.add_argument(
        "--version-compatible", action="store_true", help="runs on later TensorRT too (and on the lean runtime)"
    )
    engine.add_argument(
        "--timing-cache", type=Path, help="timing cache to reuse and update (default: REPOSITORY/.timing.cache)"
    )
    engine.set_defaults(step_run=_engine)


def _model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a folder name in the repository, e.g. mlp-light")
    parser.add_argument("--repository", type=Path, default=None, help="the model repository (default: engines/)")


def _progress(text: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f} s] {text}", file=sys.stderr, flush=True)


def _folder(args: argparse.Namespace) -> ModelFolder:
    from edged.models.manifest import ModelFolder

    return ModelFolder(args.repository or default_repository(), args.model)


def _quantize(args: argparse.Namespace) -> int:
    from edged.toolchain.quantize import quantize

    done = quantize(
        _folder(args),
        args.precision,
        calibration=args.calibration,
        calibration_count=args.samples,
        held_out_count=args.held_out,
        quantizer=args.quantizer,
        progress=_progress,
    )
    print(f"wrote {done.path} (served as {args.model}:{args.precision})")
    print(f"accuracy against FP32 ({args.precision}, {args.quantizer}; the Q/DQ graph's math, as TensorRT runs it):")
    for line in done.accuracy.lines():
        print(f"  {line}")
    if done.cpu_differs():
        print("this CPU's fused integer kernels differ (no VNNI: their 16-bit sums saturate); the CPU daemon")
        print("serves the graph unfused here. What the fused kernels give, against FP32:")
        for line in done.cpu_accuracy.lines():
            print(f"  {line}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    from edged.toolchain.convert import convert

    _progress(f"converting {args.model} to {args.precision}")
    print(f"wrote {convert(_folder(args), args.precision)}")
    return 0


def _engine(args: argparse.Namespace) -> int:
    from edged.toolchain.engine import BatchRange, build_engine

    folder = _folder(args)
    record = build_engine(
        folder,
        args.precision,
        BatchRange(args.min_batch, args.opt_batch, args.max_batch),
        version_compatible=args.version_compatible,
        timing_cache=args.timing_cache or folder.path.parent / ".timing.cache",
        progress=_progress,
    )
    print(f"wrote {folder.path / record.file} for {record.gpu_name} (TensorRT {record.tensorrt_version})")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run a build step; a step that cannot run here says why in one line and exits 1."""
    try:
        return _run(args)
    except ModuleNotFoundError as exc:
        if exc.name != "onnxruntime":
            raise
        from edged.backends import NO_RUNTIME

        print(f"edged build {args.step}: needs {NO_RUNTIME}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    from edged.models.repository import RepositoryError
    from edged.toolchain.calibration import CalibrationError
    from edged.toolchain.convert import ConvertError
    from edged.toolchain.engine import EngineBuildError
    from edged.toolchain.quantize import QuantizeError

    try:
        return args.step_run(args)
    except (CalibrationError, ConvertError, EngineBuildError, QuantizeError, RepositoryError) as exc:
        print(f"edged build {args.step}: {exc}", file=sys.stderr)
        return 1
