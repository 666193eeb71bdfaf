"""The model repository: what the daemon finds in engines/, and how it refuses a
folder it cannot serve (naming the manifest, so a person knows which file to fix)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from support import ENGINES

from edged.models.repository import RepositoryError, discover
from edged.wire.codec import TensorSpec


def test_demo_repository_serves_both_models_with_their_signatures() -> None:
    entries = {entry.name: entry for entry in discover(ENGINES, "onnxruntime")}
    assert set(entries) == {"mlp-light", "cnn-heavy"}
    light, heavy = entries["mlp-light"], entries["cnn-heavy"]
    assert light.signature.inputs == (TensorSpec("x", "float32", (-1, 64)),)
    assert light.signature.outputs == (TensorSpec("scores", "float32", (-1, 10)),)
    assert heavy.signature.inputs == (TensorSpec("image", "float32", (-1, 3, 64, 64)),)
    assert heavy.signature.outputs == (TensorSpec("logits", "float32", (-1, 10)),)
    for entry in entries.values():
        assert entry.variant.path.is_file()
        assert (entry.variant.backend, entry.variant.precision) == ("onnxruntime", "fp32")
        assert entry.signature.batchable
        assert entry.to_wire()["name"] == entry.name


def test_only_the_named_models_are_served() -> None:
    assert [entry.name for entry in discover(ENGINES, "onnxruntime", ("mlp-light",))] == ["mlp-light"]


def test_naming_a_model_the_repository_lacks_is_refused() -> None:
    with pytest.raises(RepositoryError, match=r"server\.models") as caught:
        discover(ENGINES, "onnxruntime", ("mlp-light", "resnet"))
    assert "resnet" in str(caught.value)


def test_a_backend_no_model_has_is_refused() -> None:
    with pytest.raises(RepositoryError, match="tensorrt"):
        discover(ENGINES, "tensorrt")


def test_a_missing_repository_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="not a directory"):
        discover(tmp_path / "absent", "onnxruntime")


def test_an_empty_repository_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="no model"):
        discover(tmp_path, "onnxruntime")


def manifest(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "name": "toy",
        "inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [-1, 4]}],
        "variants": [{"precision": "fp32", "backend": "onnxruntime", "file": "model.onnx"}],
    }
    fields.update(changes)
    return fields


def write_model(root: Path, content: Any, raw: str | None = None) -> Path:
    folder = root / "toy"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(b"not read by discover")
    (folder / "manifest.json").write_text(raw if raw is not None else json.dumps(content))
    return folder / "manifest.json"


def test_other_precisions_are_served_beside_the_fp32_one(tmp_path: Path) -> None:
    variants = [
        {"precision": "fp32", "backend": "onnxruntime", "file": "model.onnx"},
        {"precision": "fp16", "backend": "onnxruntime", "file": "model-fp16.onnx"},
        {"precision": "int8", "backend": "tensorrt", "file": "absent.plan"},  # another backend's: not looked at
    ]
    write_model(tmp_path, manifest(variants=variants))
    shutil.copy(tmp_path / "toy" / "model.onnx", tmp_path / "toy" / "model-fp16.onnx")
    entries = {entry.name: entry for entry in discover(tmp_path, "onnxruntime")}
    assert set(entries) == {"toy", "toy:fp16"}
    assert entries["toy:fp16"].variant.path == tmp_path / "toy" / "model-fp16.onnx"
    assert entries["toy:fp16"].to_wire()["precision"] == "fp16"


BAD_MANIFESTS: dict[str, tuple[Any, str | None]] = {
    "not json": (None, "{not json"),
    "not an object": ([1, 2], None),
    "no name": (manifest(name=None), None),
    "empty name": (manifest(name=""), None),
    "no inputs": (manifest(inputs=[]), None),
    "outputs not a list": (manifest(outputs="y"), None),
    "input with unknown dtype": (manifest(inputs=[{"name": "x", "dtype": "float64", "shape": [4]}]), None),
    "input without a shape": (manifest(inputs=[{"name": "x", "dtype": "float32"}]), None),
    "dimension below -1": (manifest(inputs=[{"name": "x", "dtype": "float32", "shape": [-2, 4]}]), None),
    "variant without a file": (manifest(variants=[{"precision": "fp32", "backend": "onnxruntime"}]), None),
    "variant file absent": (
        manifest(variants=[{"precision": "fp32", "backend": "onnxruntime", "file": "absent.onnx"}]),
        None,
    ),
    "variant not an object": (manifest(variants=["model.onnx"]), None),
    "variants not a list": (manifest(variants=5), None),
    "dtype not a string": (manifest(inputs=[{"name": "x", "dtype": ["float32"], "shape": [4]}]), None),
}


@pytest.mark.parametrize("case", list(BAD_MANIFESTS))
def test_a_bad_manifest_is_refused_naming_the_file(tmp_path: Path, case: str) -> None:
    content, raw = BAD_MANIFESTS[case]
    path = write_model(tmp_path, content, raw)
    with pytest.raises(RepositoryError) as caught:
        discover(tmp_path, "onnxruntime")
    assert str(path) in str(caught.value)
