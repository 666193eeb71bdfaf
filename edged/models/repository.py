"""The model repository: one folder per model, each with a manifest.json.

    engines/<model>/manifest.json   name, inputs, outputs, variants
    engines/<model>/model.onnx      a variant's file, named by the manifest

A variant is one servable form of the model (a backend and a precision). The
daemon serves, per model, the variants its configured backend can run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edged.models.engines import EngineRecord, EngineRecordError
from edged.models.warmup import WarmupError, WarmupSample, default_sample, read_warmup
from edged.wire.codec import DTYPES, TensorSpec
from edged.wire.signature import Signature

if TYPE_CHECKING:
    from edged.models.pipeline import Pipeline

MANIFEST = "manifest.json"
PIPELINE = "pipeline.toml"  # a folder that holds a pipeline (edged.models.pipeline) instead of a model
NOT_MODELS = {"lost+found"}  # what a repository on a file system of its own holds besides models


class RepositoryError(ValueError):
    """A model folder or manifest that cannot be served; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Variant:
    precision: str
    backend: str
    path: Path  # the file to load; for "tensorrt", the model's folder (the engine is chosen at load)
    # For "tensorrt": every engine of this precision (one per GPU model and TensorRT version),
    # and the ONNX Runtime variant of the same precision to fall back to, if there is one.
    engines: tuple[EngineRecord, ...] = ()
    fallback: Path | None = None


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One servable model: the name clients send, its signature and the file to load."""

    name: str
    description: str
    signature: Signature
    variant: Variant
    warmup: tuple[WarmupSample, ...] = ()  # the manifest's "warmup" samples (or the default one)
    manifest: Path | None = None  # where it was read: named by every error about the model
    # What the backend decided at load (edged.backends.Describing), shown in `models`.
    served: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    # Set for a pipeline: the steps it runs in place of one backend call (edged.models.pipeline).
    pipeline: Pipeline | None = field(default=None, hash=False, compare=False)

    @property
    def samples(self) -> tuple[WarmupSample, ...]:
        return self.warmup or (default_sample(self.signature),)

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "backend": self.variant.backend,
            "precision": self.variant.precision,
            **self.signature.to_wire(),
            **self.served,
            **({"steps": [step.to_wire() for step in self.pipeline.steps]} if self.pipeline else {}),
        }


def discover(root: Path, backend: str, only: tuple[str, ...] = (), folders: Folders | None = None) -> list[ModelEntry]:
    """Every model under `root` with a variant for `backend` (or just those in `only`),
    from `folders` where the caller scanned `root` already. A model folder that cannot be
    read is left out: `scan` names it, and why."""
    entries = []
    for manifest_path in (folders or scan(root)).manifests:
        entries.extend(entries_of(manifest_path, backend))
    names = {entry.name for entry in entries}
    missing = sorted(set(only) - names)
    if missing:
        raise RepositoryError(
            f"server.models names {missing}, which {root} has no {backend} variant of; it has {sorted(names)}"
        )
    if only:
        entries = [entry for entry in entries if entry.name in only]
    if not entries:
        raise RepositoryError(f"model repository {root} has no model with a {backend} variant")
    return entries


@dataclass(frozen=True, slots=True)
class Folders:
    """What a repository holds: each model folder's manifest, in name order, and by folder
    name why each folder that may hold a model cannot be read (a model the daemon cannot
    see must fail, never vanish)."""

    manifests: list[Path]
    unreadable: dict[str, str]
    pipelines: list[Path] = field(default_factory=list)  # each pipeline folder's pipeline.toml


def scan(root: Path) -> Folders:
    """`root`'s model folders, read once; an unreadable repository is refused as such."""
    if not root.is_dir():
        raise RepositoryError(f"model repository {root} is not a directory: set server.model_repository")
    try:
        folders = sorted(path for path in root.iterdir() if path.is_dir() and path.name not in NOT_MODELS)
    except OSError as exc:
        raise RepositoryError(
            f"model repository {root} cannot be read ({exc.strerror}): give the daemon's user read access to it"
        ) from None
    manifests, refused, pipelines = [], {}, []
    for folder in folders:
        try:
            (folder / MANIFEST).stat()
        except FileNotFoundError:
            if (folder / PIPELINE).is_file():
                pipelines.append(folder / PIPELINE)
            continue  # a folder without a manifest holds no model
        except OSError as exc:
            refused[folder.name] = (
                f"model folder {folder} cannot be read ({exc.strerror}): give the daemon's user read access to it, "
                "or move it out of the repository"
            )
            continue
        manifests.append(folder / MANIFEST)
    return Folders(manifests, refused, pipelines)


def entries_of(manifest_path: Path, backend: str) -> list[ModelEntry]:
    """The models one manifest serves on `backend`, checked."""
    where = str(manifest_path)
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RepositoryError(f"{where}: cannot be read as JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise RepositoryError(f"{where}: must hold a JSON object")
    name = manifest.get("name")
    if not isinstance(name, str) or not name:
        raise RepositoryError(f"{where}: 'name' must be a non-empty string")
    signature = Signature(read_specs(manifest, "inputs", where), read_specs(manifest, "outputs", where))
    variants = manifest.get("variants", [])
    if not isinstance(variants, list):
        raise RepositoryError(f"{where}: 'variants' must be a list of {{precision, backend, file}}")
    for i, raw in enumerate(variants):
        if not isinstance(raw, dict) or not all(isinstance(raw.get(k), str) for k in ("precision", "backend", "file")):
            raise RepositoryError(f"{where}: variants[{i}] needs string 'precision', 'backend' and 'file'")
        path = manifest_path.parent / raw["file"]
        if raw["backend"] == backend and not path.is_file():
            raise RepositoryError(f"{where}: variants[{i}] names {path}, which does not exist")
    description = str(manifest.get("description", ""))
    try:
        warmup = read_warmup(manifest, signature, manifest_path.parent, where)
    except WarmupError as exc:
        raise RepositoryError(str(exc)) from None
    if backend == "tensorrt":
        entries = _engine_entries(manifest_path, name, description, signature, variants)
    else:
        entries = [
            ModelEntry(
                _served(name, raw["precision"]),
                description,
                signature,
                Variant(raw["precision"], backend, manifest_path.parent / raw["file"]),
            )
            for raw in variants
            if raw["backend"] == backend
        ]
    return [replace(entry, warmup=warmup, manifest=manifest_path) for entry in entries]


def _served(name: str, precision: str) -> str:
    # The FP32 variant keeps the model's name; another precision is served beside it.
    return name if precision == "fp32" else f"{name}:{precision}"


def _engine_entries(
    manifest_path: Path, name: str, description: str, signature: Signature, variants: list[dict[str, Any]]
) -> list[ModelEntry]:
    """One entry per precision with engines: which engine runs is decided at load, on the GPU."""
    where, folder = str(manifest_path), manifest_path.parent
    engines: dict[str, list[EngineRecord]] = {}
    for raw in variants:
        if raw["backend"] == "tensorrt":
            try:
                engine = EngineRecord.from_manifest(raw, where)
            except EngineRecordError as exc:
                raise RepositoryError(str(exc)) from None
            engines.setdefault(engine.precision, []).append(engine)
    onnx = {raw["precision"]: folder / raw["file"] for raw in variants if raw["backend"] == "onnxruntime"}
    return [
        ModelEntry(
            _served(name, precision),
            description,
            signature,
            Variant(precision, "tensorrt", folder, tuple(found), onnx.get(precision)),
        )
        for precision, found in engines.items()
    ]


def read_specs(manifest: dict[str, Any], key: str, where: str) -> tuple[TensorSpec, ...]:
    raw = manifest.get(key)
    if not isinstance(raw, list) or not raw:
        raise RepositoryError(f"{where}: '{key}' must be a non-empty list of {{name, dtype, shape}}")
    specs = []
    for item in raw:
        ok = (
            isinstance(item, dict)
            and isinstance(item.get("name"), str)
            and isinstance(item.get("dtype"), str)
            and item["dtype"] in DTYPES
            and isinstance(item.get("shape"), list)
            and all(isinstance(d, int) and d >= -1 for d in item["shape"])
        )
        if not ok:
            raise RepositoryError(f"{where}: {key} entry {item!r} needs a name, a known dtype and a shape of ints")
        specs.append(TensorSpec(item["name"], item["dtype"], tuple(item["shape"])))
    return tuple(specs)


def unreadable_file(model: ModelEntry) -> str | None:
    """Why a file `model` is loaded from cannot be opened for reading, or None. Asked at
    every load: a reload reuses the weights of an unchanged file without reading it, and
    must refuse what a restart would fail on (edged.daemon.loading)."""
    variant = model.variant
    files = [variant.path]
    if variant.backend == "tensorrt":  # the folder: its engines, the ONNX they were built from, the fallback
        engines = [variant.path / name for e in variant.engines for name in (e.file, e.source_file)]
        files = [*dict.fromkeys(engines), *([variant.fallback] if variant.fallback else [])]
    for path in files:
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            return f"{path} cannot be read ({exc.strerror}): give the daemon's user read access to it"
    return None


def sha256_of(path: Path) -> str:
    """The hex SHA-256 of a file, as a manifest records it for each variant and source."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
