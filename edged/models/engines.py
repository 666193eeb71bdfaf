"""TensorRT engines in the model repository: what each was built from and for, and
which one this GPU and this TensorRT may load.

An engine is a variant with backend "tensorrt"; its manifest entry records:

    precision, file, sha256            the engine (plan) file
    source_file, source_sha256         the ONNX it was built from
    tensorrt_version, version_compatible
    gpu_name, compute_capability       "9.0"
    profiles                           [{input: {min, opt, max}}], one per optimization profile
    built_at                           ISO 8601, UTC

Selection is pure: the GPU and TensorRT are given as an `Environment` value, so the
rules run and are tested without either. A refused engine is never loaded: each
refusal is a sentence saying why, and the caller logs them or raises with them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

FP8_MIN_CC = (8, 9)  # FP8 tensor cores: Ada and Hopper on
Shape = tuple[int, ...]


class EngineRecordError(ValueError):
    """A manifest entry for an engine that is missing a field or holds a wrong type."""


@dataclass(frozen=True, slots=True)
class Environment:
    """The GPU and TensorRT runtime an engine would run on."""

    gpu_name: str
    compute_capability: tuple[int, int]
    tensorrt_version: str
    lean: bool = False  # the lean runtime (tensorrt_lean) runs version-compatible engines only


@dataclass(frozen=True, slots=True)
class ShapeRange:
    min: Shape
    opt: Shape
    max: Shape


@dataclass(frozen=True, slots=True)
class EngineRecord:
    precision: str
    file: str
    sha256: str
    source_file: str
    source_sha256: str
    tensorrt_version: str
    version_compatible: bool
    gpu_name: str
    compute_capability: tuple[int, int]
    profiles: tuple[dict[str, ShapeRange], ...]
    built_at: str
    backend: str = field(default="tensorrt", init=False)

    def to_manifest(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "backend": self.backend,
            "file": self.file,
            "sha256": self.sha256,
            "source_file": self.source_file,
            "source_sha256": self.source_sha256,
            "tensorrt_version": self.tensorrt_version,
            "version_compatible": self.version_compatible,
            "gpu_name": self.gpu_name,
            "compute_capability": "{}.{}".format(*self.compute_capability),
            "profiles": [
                {name: {"min": list(r.min), "opt": list(r.opt), "max": list(r.max)} for name, r in profile.items()}
                for profile in self.profiles
            ],
            "built_at": self.built_at,
        }

    @classmethod
    def from_manifest(cls, raw: dict[str, Any], where: str) -> EngineRecord:
        strings = ("precision", "file", "sha256", "source_file", "source_sha256", "tensorrt_version", "gpu_name")
        for key in (*strings, "built_at", "compute_capability"):
            if not isinstance(raw.get(key), str):
                raise EngineRecordError(f"{where}: engine entry needs a string {key!r}")
        if not isinstance(raw.get("version_compatible"), bool):
            raise EngineRecordError(f"{where}: engine entry needs 'version_compatible': true or false")
        return cls(
            **{key: raw[key] for key in strings},
            version_compatible=raw["version_compatible"],
            compute_capability=parse_cc(raw["compute_capability"], where),
            profiles=_profiles(raw.get("profiles"), where),
            built_at=raw["built_at"],
        )


def parse_cc(text: str, where: str = "compute capability") -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)\.(\d+)", text)
    if not match:
        raise EngineRecordError(f"{where}: compute capability {text!r} is not MAJOR.MINOR")
    return int(match[1]), int(match[2])


def _profiles(raw: Any, where: str) -> tuple[dict[str, ShapeRange], ...]:
    if not isinstance(raw, list) or not raw:
        raise EngineRecordError(f"{where}: engine entry needs 'profiles', a list of {{input: {{min, opt, max}}}}")
    profiles = []
    for profile in raw:
        ranges = {}
        for name, bounds in profile.items() if isinstance(profile, dict) else ():
            shapes = [bounds.get(k) if isinstance(bounds, dict) else None for k in ("min", "opt", "max")]
            if not all(isinstance(s, list) and all(isinstance(d, int) and d >= 0 for d in s) for s in shapes):
                raise EngineRecordError(f"{where}: profile of {name!r} needs min, opt and max shapes of ints")
            ranges[name] = ShapeRange(*(tuple(s) for s in shapes))
        if not ranges:
            raise EngineRecordError(f"{where}: an optimization profile names no input")
        profiles.append(ranges)
    return tuple(profiles)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def refusal(engine: EngineRecord, env: Environment, source_sha256: str | None) -> str | None:
    """Why `engine` may not run in `env`, or None if it may. `source_sha256` is the
    digest of the engine's source ONNX as it is now (None: the file is gone)."""
    cc = "{}.{}".format(*env.compute_capability)
    built_cc = "{}.{}".format(*engine.compute_capability)
    if engine.precision == "fp8" and env.compute_capability < FP8_MIN_CC:
        return (
            f"{engine.file}: FP8 needs compute capability 8.9 or newer (Ada, Hopper, Blackwell); "
            f"this GPU ({env.gpu_name}) has {cc}: serve the int8 or fp16 variant here"
        )
    if engine.compute_capability != env.compute_capability:
        return (
            f"{engine.file}: built for compute capability {built_cc} ({engine.gpu_name}); "
            f"this GPU ({env.gpu_name}) has {cc}"
        )
    if engine.gpu_name != env.gpu_name:
        return f"{engine.file}: built on {engine.gpu_name}; this GPU is {env.gpu_name}: build one on this GPU model"
    built, running = version_tuple(engine.tensorrt_version), version_tuple(env.tensorrt_version)
    if engine.version_compatible:
        # A version-compatible plan runs on the TensorRT that built it and on later ones, never earlier.
        if running < built:
            return (
                f"{engine.file}: version-compatible from TensorRT {engine.tensorrt_version} on; "
                f"this runtime is the older {env.tensorrt_version}"
            )
    elif running != built:
        return (
            f"{engine.file}: built with TensorRT {engine.tensorrt_version} and not version-compatible; "
            f"this runtime is {env.tensorrt_version}: rebuild, or build with --version-compatible"
        )
    if env.lean and not engine.version_compatible:
        return (
            f"{engine.file}: not version-compatible, and the lean runtime runs only version-compatible engines: "
            "install the full runtime (pip install tensorrt) or build with --version-compatible"
        )
    if source_sha256 is None:
        return f"{engine.file}: its source {engine.source_file} is missing from the model folder"
    if source_sha256 != engine.source_sha256:
        return (
            f"{engine.file}: built from {engine.source_file} with sha256 {engine.source_sha256[:12]}..., "
            f"which has changed since (now {source_sha256[:12]}...): rebuild the engine"
        )
    return None


@dataclass(frozen=True, slots=True)
class Selection:
    engine: EngineRecord | None
    refusals: tuple[str, ...]

    def explain(self, model: str) -> str:
        if not self.refusals:
            return f"{model}: the repository has no TensorRT engine for it"
        return f"{model}: no engine fits this GPU and runtime: " + "; ".join(self.refusals)


def select(engines: tuple[EngineRecord, ...], env: Environment, source_sha256: dict[str, str | None]) -> Selection:
    """The first engine that may run in `env` (newest build first), and why each other was refused."""
    refusals = []
    for engine in sorted(engines, key=lambda e: e.built_at, reverse=True):
        reason = refusal(engine, env, source_sha256.get(engine.source_file))
        if reason is None:
            return Selection(engine, tuple(refusals))
        refusals.append(reason)
    return Selection(None, tuple(refusals))
