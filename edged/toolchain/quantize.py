"""INT8 and FP8 Q/DQ quantization of a model's FP32 ONNX, checked against FP32 on the CPU.

The output is an ONNX model with QuantizeLinear/DequantizeLinear pairs: the precision
lives in the graph, which is what TensorRT's strongly typed networks build from
(TensorRT 10.1 deprecated calibrators and 11 removed them). ONNX Runtime's CPU
provider runs the same file, so accuracy is checked here before any GPU sees it.

The check runs the Q/DQ graph unfused (`session.disable_quant_qdq`): each DequantizeLinear,
then the float op, which is the graph's own math and what TensorRT computes from it. ONNX
Runtime's default fuses Q/DQ into this CPU's integer kernels, which saturate on x86
without VNNI (edged.backends.int8_kernels): their figure is reported beside, never judged.

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

from edged.backends.onnxruntime_cpu import cpu_session
from edged.models.accuracy import Accuracy, compare
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


def check_accuracy(
    folder: ModelFolder, path: Path, precision: str, samples: Samples, rows: int = 8
) -> tuple[Accuracy, Accuracy]:
    """FP32 against `path` on the same samples, `rows` at a time, on the first output: the
    Q/DQ graph's own math (unfused, as TensorRT computes it: what the bounds judge), then
    this CPU's fused integer kernels (ONNX Runtime's default, which may saturate)."""
    output = folder.outputs[0].name
    reference = _outputs(cpu_session(folder.source(), "fp32"), output, samples, rows)
    graph = compare(reference, _outputs(cpu_session(path, precision, fused=False), output, samples, rows))
    if precision == "fp8":  # no fused float8 kernels on the CPU: the same math either way
        return graph, graph
    return graph, compare(reference, _outputs(cpu_session(path, precision), output, samples, rows))


def _outputs(session: ort.InferenceSession, output: str, samples: Samples, rows: int) -> np.ndarray:
    return np.concatenate([session.run([output], batch)[0] for batch in _batches(samples, rows)])


@dataclass(frozen=True, slots=True)
class Quantized:
    path: Path
    accuracy: Accuracy  # the Q/DQ graph's own math against FP32
    cpu_accuracy: Accuracy  # this CPU's fused integer kernels against FP32
    entry: dict[str, str]

    def cpu_differs(self) -> bool:
        """Whether this CPU's fused kernels answer otherwise than the graph (saturation)."""
        return abs(self.cpu_accuracy.cosine_min - self.accuracy.cosine_min) > 1e-4


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
    accuracy, cpu_accuracy = check_accuracy(folder, target, precision, held_out(folder.inputs, held_out_count))
    entry = {
        "precision": precision,
        "backend": "onnxruntime",
        "file": target.name,
        "sha256": sha256_of(target),
        "source_sha256": sha256_of(source),
        "quantizer": quantizer,
    }
    folder.put_variant(entry)
    return Quantized(target, accuracy, cpu_accuracy, entry)


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
