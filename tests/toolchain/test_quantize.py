"""INT8/FP8 Q/DQ quantization and FP16/BF16 conversion of the demo models, on the CPU,
in a temporary copy of engines/ (the committed repository is never written)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator
from support import ENGINES, Reference, random_input, run_edged

from edged.backends.onnxruntime_cpu import OnnxRuntimeCpuRunner, cpu_session
from edged.config.classes import ClassConfig
from edged.models.accuracy import compare
from edged.models.manifest import ModelFolder
from edged.models.repository import discover
from edged.toolchain.calibration import CalibrationError, held_out
from edged.toolchain.convert import convert
from edged.toolchain.quantize import Quantized, QuantizeError, quantize

# The bounds the docs report (docs/engines.md), on seeded N(0, 1) held-out inputs. The
# demo models are random networks whose logits sit close together, so top-1 is the
# most fragile figure; cosine similarity is the one to watch.
BOUNDS = {  # (model, precision): (min cosine over samples, min top-1 agreement, max abs error)
    ("mlp-light", "int8"): (0.99, 0.90, 0.5),
    ("mlp-light", "fp8"): (0.97, 0.85, 0.8),
    ("cnn-heavy", "int8"): (0.99, 0.85, 1.0),
    ("cnn-heavy", "fp8"): (0.99, 0.85, 1.0),
}
# Calibration and held-out counts kept small for the CNN: FP8 runs at the CPU's basic level.
COUNTS = {"mlp-light": (256, 64), "cnn-heavy": (16, 8)}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo") / "engines"
    shutil.copytree(ENGINES, root)
    return root


@pytest.fixture(scope="module")
def quantized(repository: Path) -> dict[tuple[str, str], Quantized]:
    done = {}
    for model, (calibration, held) in COUNTS.items():
        for precision in ("int8", "fp8"):
            folder = ModelFolder(repository, model)
            done[model, precision] = quantize(folder, precision, calibration_count=calibration, held_out_count=held)
    return done


@pytest.mark.parametrize("key", list(BOUNDS))
def test_quantized_model_is_qdq_and_meets_its_bounds(quantized: dict, key: tuple[str, str]) -> None:
    result = quantized[key]
    ops = {node.op_type for node in onnx.load(str(result.path)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    cosine, top1, max_abs = BOUNDS[key]
    accuracy = result.accuracy
    print(key, *accuracy.lines(), sep="\n  ")
    assert accuracy.cosine_min >= cosine
    assert accuracy.top1_agreement >= top1
    assert accuracy.max_abs_error <= max_abs


@pytest.mark.parametrize("model", list(COUNTS))
def test_int8_zero_points_are_all_zero_as_tensorrt_requires(quantized: dict, model: str) -> None:
    """TensorRT takes INT8 Q/DQ only with zero-point 0 (symmetric): every zero point is 0."""
    graph = onnx.load(str(quantized[model, "int8"].path)).graph
    initializers = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    zero_points = [
        initializers[node.input[2]]
        for node in graph.node
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 2
    ]
    assert zero_points and all(not zp.any() for zp in zero_points)


def test_manifest_records_each_quantized_variant(quantized: dict, repository: Path) -> None:
    folder = ModelFolder(repository, "mlp-light")
    entry = folder.variant("int8")
    assert entry["backend"] == "onnxruntime" and entry["file"] == "model.int8.onnx"
    assert entry["source_sha256"] == folder.variant("fp32")["sha256"]
    names = {e.name: e.variant.precision for e in discover(repository, "onnxruntime")}
    assert names["mlp-light:int8"] == "int8" and names["cnn-heavy:fp8"] == "fp8"
    assert ModelFolder(ENGINES, "mlp-light").manifest["variants"][-1]["precision"] == "fp32"  # untouched


def test_fp8_variant_loads_in_the_cpu_backend_at_the_basic_level(quantized: dict, repository: Path) -> None:
    entry = next(e for e in discover(repository, "onnxruntime") if e.name == "mlp-light:fp8")
    runner = OnnxRuntimeCpuRunner(entry, ClassConfig("standard", order=0))
    x = random_input("mlp-light", 4, seed=5)
    scores = runner.run(x, ["scores"])[0]
    assert compare(Reference().run("mlp-light", x), scores).cosine_min >= 0.98
    runner.close()


def test_calibration_from_a_folder(repository: Path, tmp_path: Path) -> None:
    samples = held_out(ModelFolder(repository, "mlp-light").inputs, 24)["x"]
    np.save(tmp_path / "a.npy", samples[:12])
    np.savez(tmp_path / "b.npz", x=samples[12:])
    result = quantize(ModelFolder(repository, "mlp-light"), "int8", calibration=tmp_path, held_out_count=16)
    assert result.accuracy.cosine_mean >= 0.99
    np.save(tmp_path / "c.npy", np.zeros((2, 63), dtype=np.float32))
    with pytest.raises(CalibrationError, match=r"c\.npy: x has shape"):
        quantize(ModelFolder(repository, "mlp-light"), "int8", calibration=tmp_path)


def test_modelopt_missing_says_how_to_install(repository: Path) -> None:
    try:
        import modelopt  # noqa: F401

        pytest.skip("ModelOpt is installed here")
    except ImportError:
        pass
    with pytest.raises(QuantizeError, match=r"pip install 'nvidia-modelopt\[onnx\]'"):
        quantize(ModelFolder(repository, "mlp-light"), "int8", quantizer="modelopt", calibration_count=8)


def test_cli_quantize_prints_the_accuracy_report(tmp_path: Path) -> None:
    shutil.copytree(ENGINES / "mlp-light", tmp_path / "mlp-light")
    done = run_edged("build", "quantize", "mlp-light", "--precision", "int8", "--repository", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "served as mlp-light:int8" in done.stdout and "top-1 agreement" in done.stdout
    assert (tmp_path / "mlp-light" / "model.int8.onnx").is_file()
    missing = run_edged("build", "quantize", "nope", "--precision", "int8", "--repository", str(tmp_path))
    assert missing.returncode == 1 and "has no model 'nope'" in missing.stderr


@pytest.mark.parametrize("model", ["mlp-light", "cnn-heavy"])
def test_fp16_runs_in_onnxruntime_close_to_fp32(repository: Path, model: str) -> None:
    path = convert(ModelFolder(repository, model), "fp16")
    x = random_input(model, 4, seed=3)
    out = cpu_session(path, "fp16").run(None, x)[0]
    assert out.dtype == np.float32  # inputs and outputs stay FP32
    np.testing.assert_allclose(out, Reference().run(model, x), atol=5e-3)
    assert f"{model}:fp16" in {e.name for e in discover(repository, "onnxruntime")}


@pytest.mark.parametrize("model", ["mlp-light", "cnn-heavy"])
def test_bf16_matches_fp32_in_the_reference_evaluator(repository: Path, model: str) -> None:
    # ONNX Runtime's CPU provider has no bfloat16 Gemm/Conv: the reference evaluator checks it.
    path = convert(ModelFolder(repository, model), "bf16")
    graph = onnx.load(str(path))
    assert any(t.data_type == onnx.TensorProto.BFLOAT16 for t in graph.graph.initializer)
    x = random_input(model, 2, seed=4)
    out = ReferenceEvaluator(graph).run(None, x)[0]
    accuracy = compare(Reference().run(model, x), out)
    assert accuracy.cosine_min >= 0.999 and accuracy.max_abs_error <= 0.2
    # A BF16 file is a TensorRT source only: the CPU daemon never serves it.
    assert f"{model}:bf16" not in {e.name for e in discover(repository, "onnxruntime")}
