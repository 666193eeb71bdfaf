"""Reading and updating a model's manifest.json from the build steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edged.models.repository import MANIFEST, RepositoryError, read_specs
from edged.wire.codec import TensorSpec


class ModelFolder:
    """One folder of the repository: its manifest, read once, and the files beside it."""

    def __init__(self, repository: Path, name: str) -> None:
        self.path = repository / name
        self.manifest_path = self.path / MANIFEST
        if not self.manifest_path.is_file():
            raise RepositoryError(f"{repository} has no model {name!r} (no {self.manifest_path})")
        try:
            self.manifest: dict[str, Any] = json.loads(self.manifest_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise RepositoryError(f"{self.manifest_path}: cannot be read as JSON ({exc})") from None
        where = str(self.manifest_path)
        self.inputs: tuple[TensorSpec, ...] = read_specs(self.manifest, "inputs", where)
        self.outputs: tuple[TensorSpec, ...] = read_specs(self.manifest, "outputs", where)

    @property
    def name(self) -> str:
        return str(self.manifest["name"])

    def variant(self, precision: str, backend: str = "onnxruntime") -> dict[str, Any]:
        for raw in self.manifest.get("variants", []):
            if raw.get("precision") == precision and raw.get("backend") == backend:
                return raw
        have = sorted({(v.get("precision"), v.get("backend")) for v in self.manifest.get("variants", [])})
        raise RepositoryError(f"{self.manifest_path} has no {precision} {backend} variant; it has {have}")

    def onnx_of(self, precision: str) -> Path:
        """The ONNX file of `precision` that engines are built from (served or TensorRT-only)."""
        for raw in self.manifest.get("variants", []):
            if raw.get("precision") == precision and raw.get("backend") in ("onnxruntime", "onnx-source"):
                return self.path / raw["file"]
        how = "edged build quantize" if precision in ("int8", "fp8") else "edged build convert"
        raise RepositoryError(f"{self.manifest_path} has no {precision} ONNX: make it first with `{how}`")

    def source(self) -> Path:
        """The FP32 ONNX model every other precision is made from."""
        return self.path / self.variant("fp32")["file"]

    def put_variant(self, entry: dict[str, Any], same: tuple[str, ...] = ("precision", "backend")) -> None:
        """Add `entry`, replacing the variant that agrees with it on every key in `same`, and save."""
        variants = [v for v in self.manifest.get("variants", []) if any(v.get(k) != entry.get(k) for k in same)]
        self.manifest["variants"] = [*variants, entry]
        # Written beside and renamed over: a daemon reading the manifest never sees half of it.
        partial = self.manifest_path.with_suffix(".json.partial")
        partial.write_text(json.dumps(self.manifest, indent=2) + "\n")
        partial.replace(self.manifest_path)
