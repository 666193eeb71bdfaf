"""Engine manifests and engine selection, with explicit environments (no GPU needed),
and what the tensorrt backend and `edged build engine` say where there is no GPU."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from support import ENGINES, random_input, run_edged

from edged.backends import BackendError
from edged.backends.tensorrt import TensorRt
from edged.config import ClassConfig, ConfigError, parse_config
from edged.models.engines import EngineRecord, EngineRecordError, Environment, ShapeRange, refusal, select
from edged.models.repository import discover, sha256_of

H100 = Environment("NVIDIA H100 80GB HBM3", (9, 0), "10.13.0")
SOURCE_SHA = "a" * 64


def record(**changes: object) -> EngineRecord:
    base = EngineRecord(
        precision="int8",
        file="model.int8.h100.plan",
        sha256="b" * 64,
        source_file="model.int8.onnx",
        source_sha256=SOURCE_SHA,
        tensorrt_version="10.13.0",
        version_compatible=False,
        gpu_name="NVIDIA H100 80GB HBM3",
        compute_capability=(9, 0),
        profiles=({"x": ShapeRange((1, 64), (4, 64), (16, 64))},),
        built_at="2026-01-02T03:04:05Z",
    )
    return replace(base, **changes)


def test_manifest_round_trip() -> None:
    engine = record(version_compatible=True)
    raw = json.loads(json.dumps(engine.to_manifest()))
    assert raw["backend"] == "tensorrt" and raw["compute_capability"] == "9.0"
    assert raw["profiles"] == [{"x": {"min": [1, 64], "opt": [4, 64], "max": [16, 64]}}]
    assert EngineRecord.from_manifest(raw, "m.json") == engine


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("gpu_name", None, "needs a string 'gpu_name'"),
        ("version_compatible", "yes", "'version_compatible': true or false"),
        ("compute_capability", "sm90", "is not MAJOR.MINOR"),
        ("profiles", [{"x": {"min": [1], "opt": [1]}}], "needs min, opt and max"),
        ("profiles", [], "needs 'profiles'"),
    ],
)
def test_bad_manifest_entries_are_named(key: str, value: object, message: str) -> None:
    raw = record().to_manifest()
    raw[key] = value
    with pytest.raises(EngineRecordError, match=message):
        EngineRecord.from_manifest(raw, "m.json")


def test_matching_engine_is_selected() -> None:
    assert refusal(record(), H100, SOURCE_SHA) is None
    chosen = select((record(),), H100, {"model.int8.onnx": SOURCE_SHA})
    assert chosen.engine == record() and chosen.refusals == ()


@pytest.mark.parametrize(
    ("engine", "env", "source", "message"),
    [
        (record(), replace(H100, compute_capability=(8, 0), gpu_name="A100"), SOURCE_SHA, "compute capability 9.0"),
        (record(), replace(H100, gpu_name="NVIDIA H200"), SOURCE_SHA, "built on NVIDIA H100 80GB HBM3; this GPU is"),
        (record(), replace(H100, tensorrt_version="10.14.1"), SOURCE_SHA, "not version-compatible"),
        (
            record(version_compatible=True),
            replace(H100, tensorrt_version="10.12.0"),
            SOURCE_SHA,
            "this runtime is the older 10.12.0",
        ),
        (record(), replace(H100, lean=True), SOURCE_SHA, "lean runtime runs only version-compatible"),
        (record(), H100, "c" * 64, "which has changed since"),
        (record(), H100, None, "is missing from the model folder"),
        (
            record(precision="fp8", compute_capability=(8, 6), gpu_name="A10"),
            Environment("A10", (8, 6), "10.13.0"),
            SOURCE_SHA,
            "FP8 needs compute capability 8.9 or newer",
        ),
    ],
)
def test_each_refusal_says_why(engine: EngineRecord, env: Environment, source: str | None, message: str) -> None:
    reason = refusal(engine, env, source)
    assert reason is not None and message in reason
    chosen = select((engine,), env, {engine.source_file: source})
    assert chosen.engine is None and message in chosen.explain("mlp-light")


def test_version_compatible_engine_runs_on_a_later_tensorrt() -> None:
    assert refusal(record(version_compatible=True), replace(H100, tensorrt_version="11.4.0"), SOURCE_SHA) is None
    assert refusal(record(version_compatible=True), replace(H100, lean=True), SOURCE_SHA) is None


def test_selection_prefers_the_newest_fitting_engine_and_lists_the_others() -> None:
    a100 = record(file="a100.plan", gpu_name="A100", compute_capability=(8, 0), built_at="2026-03-01T00:00:00Z")
    old = record(file="old.plan", built_at="2025-01-01T00:00:00Z")
    new = record(file="new.plan", built_at="2026-02-01T00:00:00Z")
    chosen = select((old, a100, new), H100, {"model.int8.onnx": SOURCE_SHA})
    assert chosen.engine == new
    assert len(chosen.refusals) == 1 and chosen.refusals[0].startswith("a100.plan")


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "engines"
    shutil.copytree(ENGINES / "mlp-light", root / "mlp-light")
    folder = root / "mlp-light"
    # An "engine" whose bytes are never deserialized here: selection refuses it first.
    (folder / "model.h100.plan").write_bytes(b"not a real plan")
    engine = record(
        precision="fp32",
        file="model.h100.plan",
        sha256=sha256_of(folder / "model.h100.plan"),
        source_file="model.onnx",
        source_sha256=sha256_of(folder / "model.onnx"),
    )
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["variants"].append(engine.to_manifest())
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_repository_serves_one_tensorrt_entry_per_precision(repository: Path) -> None:
    (entry,) = discover(repository, "tensorrt")
    assert entry.name == "mlp-light" and entry.variant.backend == "tensorrt"
    assert [e.file for e in entry.variant.engines] == ["model.h100.plan"]
    assert entry.variant.fallback == repository / "mlp-light" / "model.onnx"
    assert [e.name for e in discover(repository, "onnxruntime")] == ["mlp-light"]


def test_tensorrt_backend_without_a_gpu_says_so_and_how_to_fix(repository: Path) -> None:
    (entry,) = discover(repository, "tensorrt")
    with pytest.raises(BackendError) as caught:
        TensorRt().load(entry, ClassConfig("standard", order=0))
    text = str(caught.value)
    assert "the tensorrt backend needs a CUDA GPU" in text or "TensorRT is not installed" in text
    assert 'server.fallback = "onnxruntime"' in text


def test_tensorrt_backend_falls_back_to_onnxruntime_when_configured(repository: Path) -> None:
    (entry,) = discover(repository, "tensorrt")
    runner = TensorRt(fallback="onnxruntime").load(entry, ClassConfig("standard", order=0))
    assert runner.run(random_input("mlp-light", 2, seed=1), ["scores"])[0].shape == (2, 10)
    runner.close()


def test_fallback_is_checked_in_config(tmp_path: Path) -> None:
    config = parse_config({"server": {"backend": "tensorrt", "fallback": "onnxruntime"}}, tmp_path)
    assert config.fallback == "onnxruntime"
    assert parse_config({}, tmp_path).fallback is None
    with pytest.raises(ConfigError, match=r"server\.fallback"):
        parse_config({"server": {"fallback": "onnxruntime"}}, tmp_path)  # backend is onnxruntime
    with pytest.raises(ConfigError, match=r"server\.fallback"):
        parse_config({"server": {"backend": "tensorrt", "fallback": "cuda"}}, tmp_path)


def test_build_engine_without_a_gpu_says_so_in_one_line(tmp_path: Path) -> None:
    shutil.copytree(ENGINES / "mlp-light", tmp_path / "mlp-light")
    done = run_edged("build", "engine", "mlp-light", "--precision", "fp32", "--repository", str(tmp_path))
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("edged build engine: ") and ("needs an NVIDIA GPU" in line or "pip install tensorrt" in line)


def test_build_engine_checks_its_arguments_before_the_gpu(tmp_path: Path) -> None:
    shutil.copytree(ENGINES / "mlp-light", tmp_path / "mlp-light")
    common = ["build", "engine", "mlp-light", "--repository", str(tmp_path)]
    done = run_edged(*common, "--precision", "int8")
    assert done.returncode == 1 and "has no int8 ONNX: make it first with `edged build quantize`" in done.stderr
    done = run_edged(*common, "--precision", "fp32", "--min-batch", "4", "--max-batch", "2")
    assert done.returncode == 1 and "1 <= min <= opt <= max" in done.stderr
