"""INT8 and FP8 Q/DQ quantization of a model's FP32 ONNX, checked against FP32 on the CPU.

The output is an ONNX model with QuantizeLinear/DequantizeLinear pairs: the precision
lives in the graph, which is what TensorRT's strongly typed networks build from
(TensorRT 10.1 deprecated calibrators and 11 removed them). ONNX Runtime's CPU
provider runs the same file, so accuracy is checked here before any GPU sees it.

Two quantizers:
- "onnxruntime" (default): `onnxruntime.quantization.quantize_static`, already installed.
  INT8: symmetric activations and per-channel symmetric weights, because TensorRT
  accepts only zero-point 0. FP8 E4M3: the Distribution calibrator, and
  QDQKeepRemovableActivations, without which the Relus are folded away and the
  output drifts (cosine 0.56 on the demo MLP, see the device notes).
- "modelopt": NVIDIA ModelOpt's ONNX PTQ, for a GPU build box (a multi-GB install
  that replaces onnxruntime with onnxruntime-gpu): imported only when asked for.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from edged.models.manifest import ModelFolder
from edged.models.repository import sha256_of
from edged.toolchain import Progress
from edged.toolchain.calibration import Samples, held_out, load_calibration, standard_normal

PRECISIONS = ("int8", "fp8")
QUANTIZERS = ("onnxruntime", "modelopt")
MODELOPT_HINT = (
    "NVIDIA ModelOpt is not installed: `pip install 'nvidia-modelopt[onnx]'` on a build box "
    "(a large install that replaces onnxruntime with onnxruntime-gpu), or use --quantizer onnxruntime"
)


class QuantizeError(RuntimeError):
    """A quantization that cannot be done here; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Accuracy:
    """How far a quantized model's outputs are from FP32's on the same held-out samples."""

    samples: int
    max_abs_error: float
    mean_abs_error: float
    cosine_min: float
    cosine_mean: float
    top1_agreement: float

    def lines(self) -> list[str]:
        return [
            f"held-out samples    {self.samples}",
            f"max abs error       {self.max_abs_error:.4f}",
            f"mean abs error      {self.mean_abs_error:.4f}",
            f"cosine (min, mean)  {self.cosine_min:.4f}, {self.cosine_mean:.5f}",
            f"top-1 agreement     {self.top1_agreement:.3f}",
        ]


def compare(reference: np.ndarray, candidate: np.ndarray) -> Accuracy:
    """Accuracy of `candidate` against `reference`, both [N, classes] scores."""
    ref = reference.reshape(len(reference), -1).astype(np.float64)
    out = candidate.reshape(len(candidate), -1).astype(np.float64)
    error = np.abs(out - ref)
    # A zero vector has no direction: count it as agreeing only with another zero vector.
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(out, axis=1)
    cosine = np.where(norms > 0, (ref * out).sum(axis=1) / np.maximum(norms, 1e-30), 1.0)
    return Accuracy(
        samples=len(ref),
        max_abs_error=float(error.max()),
        mean_abs_error=float(error.mean()),
        cosine_min=float(cosine.min()),
        cosine_mean=float(cosine.mean()),
        top1_agreement=float((ref.argmax(axis=1) == out.argmax(axis=1)).mean()),
    )


def session(path: Path, precision: str) -> ort.InferenceSession:
    """A CPU session; FP8 Q/DQ models load only at the basic optimization level there."""
    options = ort.SessionOptions()
    if precision == "fp8":
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def check_accuracy(folder: ModelFolder, path: Path, precision: str, samples: Samples, rows: int = 8) -> Accuracy:
    """Run FP32 and `path` on the same samples, `rows` at a time, and compare the first output."""
    reference, candidate = session(folder.source(), "fp32"), session(path, precision)
    output = folder.outputs[0].name
    count = len(next(iter(samples.values())))
    ref_parts, out_parts = [], []
    for start in range(0, count, rows):
        batch = {name: array[start : start + rows] for name, array in samples.items()}
        ref_parts.append(reference.run([output], batch)[0])
        out_parts.append(candidate.run([output], batch)[0])
    return compare(np.concatenate(ref_parts), np.concatenate(out_parts))


@dataclass(frozen=True, slots=True)
class Quantized:
    path: Path
    accuracy: Accuracy
    entry: dict[str, str]


def quantize(
    folder: ModelFolder,
    precision: str,
    *,
    calibration: Path | None = None,
    calibration_count: int = 256,
    held_out_count: int = 32,
    quantizer: str = "onnxruntime",
    progress: Progress = lambda _: None,
) -> Quantized:
    """Write model.PRECISION.onnx beside the FP32 model, check it, and record it in the manifest."""
    if precision not in PRECISIONS:
        raise QuantizeError(f"precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if quantizer not in QUANTIZERS:
        raise QuantizeError(f"quantizer {quantizer!r}: choose one of {', '.join(QUANTIZERS)}")
    source = folder.source()
    if calibration is None:
        progress(f"calibration: {calibration_count} samples drawn from a standard normal (seed 0)")
        samples = standard_normal(folder.inputs, calibration_count, seed=0)
    else:
        samples = load_calibration(calibration, folder.inputs)
        progress(f"calibration: {len(next(iter(samples.values())))} samples from {calibration}")
    target = folder.path / f"{source.stem}.{precision}.onnx"
    progress(f"quantizing {source.name} to {precision} with {quantizer}")
    if quantizer == "onnxruntime":
        _onnxruntime(source, target, precision, samples)
    else:
        _modelopt(source, target, precision, samples)
    progress(f"checking {target.name} against FP32 on {held_out_count} held-out samples")
    accuracy = check_accuracy(folder, target, precision, held_out(folder.inputs, held_out_count))
    entry = {
        "precision": precision,
        "backend": "onnxruntime",
        "file": target.name,
        "sha256": sha256_of(target),
        "source_sha256": sha256_of(source),
        "quantizer": quantizer,
    }
    folder.put_variant(entry)
    return Quantized(target, accuracy, entry)


def _batches(samples: Samples, rows: int = 8) -> Iterator[dict[str, np.ndarray]]:
    count = len(next(iter(samples.values())))
    for start in range(0, count, rows):
        yield {name: array[start : start + rows] for name, array in samples.items()}


def _onnxruntime(source: Path, target: Path, precision: str, samples: Samples) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._batches = _batches(samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._batches, None)

    if precision == "int8":
        kind, method = QuantType.QInt8, CalibrationMethod.MinMax
        options = {"ActivationSymmetric": True, "WeightSymmetric": True}
        per_channel = True
    else:
        kind, method = QuantType.QFLOAT8E4M3FN, CalibrationMethod.Distribution
        options = {"QDQKeepRemovableActivations": True}
        per_channel = False  # ORT's FP8 quantizer takes one scale per tensor
    quantize_static(
        str(source),
        str(target),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=per_channel,
        activation_type=kind,
        weight_type=kind,
        calibrate_method=method,
        extra_options=options,
        calibration_providers=["CPUExecutionProvider"],
    )
    onnx.checker.check_model(str(target))


def _modelopt(source: Path, target: Path, precision: str, samples: Samples) -> None:
    """ModelOpt's ONNX PTQ (modelopt.onnx.quantization.quantize); not installed in CI, not run here."""
    try:
        from modelopt.onnx.quantization import quantize as modelopt_quantize
    except ImportError:
        raise QuantizeError(MODELOPT_HINT) from None
    calibration = {name: array for name, array in samples.items()}
    # With a dynamic batch ModelOpt finds no GEMM worth quantizing unless told the
    # calibration shapes; give it the shapes of the data it calibrates on.
    shapes = ",".join(f"{name}:{'x'.join(map(str, array.shape))}" for name, array in calibration.items())
    modelopt_quantize(
        onnx_path=str(source),
        quantize_mode=precision,
        calibration_data=calibration,
        calibration_shapes=shapes,
        calibration_eps=["cpu"],
        output_path=str(target),
    )
