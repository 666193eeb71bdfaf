"""Warm-up samples: the inputs each model is warmed up and first timed with.

A manifest may give them under "warmup", a list of samples:

    "warmup": [{"shapes": {"input": [1, 512]}, "data": {"input": "random", "sr": 16000}}]

`shapes` gives concrete sizes for inputs with dynamic dimensions (an input left out
takes 1 for each); `data` is "zeros" (the default), "random", a .npy or .npz file
beside the manifest, or a map from input name to one of those or a number. Without
"warmup", one sample of zeros with 1 for every dynamic dimension is used, which a
model with a minimum input size (a reflect Pad, a convolution window) refuses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edged.wire.codec import TensorSpec
from edged.wire.signature import Signature
from edged.wire.tensors import DTYPES

FILLS = ("zeros", "random")


class WarmupError(ValueError):
    """A "warmup" entry that cannot be used; the message names the key and the fix."""


@dataclass(frozen=True, slots=True)
class WarmupSample:
    """One sample: a shape per input (dynamic dimensions made concrete) and how to fill each."""

    shapes: Mapping[str, tuple[int, ...]]
    dtypes: Mapping[str, str]  # by input: its wire dtype name
    data: Mapping[str, str | float] = field(default_factory=dict)  # by input: a fill, a file or a number
    folder: Path = Path()  # where files named in `data` live: the manifest's folder

    def inputs(self, rows: int | None = None) -> dict[str, np.ndarray]:
        """The sample's arrays; with `rows`, repeated along dimension 0 to that many rows."""
        rng = np.random.default_rng(0)  # seeded: every start-up warms up on the same inputs
        arrays = {name: self._array(name, shape, rng) for name, shape in self.shapes.items()}
        if rows is not None:
            arrays = {name: np.take(a, np.arange(rows) % a.shape[0], axis=0) for name, a in arrays.items()}
        return arrays

    def _array(self, name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        dtype = np.dtype(DTYPES[self.dtypes[name]])
        how = self.data.get(name, "zeros")
        if isinstance(how, float | int):
            return np.full(shape, how, dtype=dtype)
        if how == "zeros":
            return np.zeros(shape, dtype=dtype)
        if how == "random":
            if np.issubdtype(dtype, np.floating):
                return rng.standard_normal(shape).astype(dtype)
            return rng.integers(0, 2, size=shape).astype(dtype)  # 0 and 1: valid as any index or flag
        loaded = np.load(self.folder / how)
        array = loaded[name] if isinstance(loaded, np.lib.npyio.NpzFile) else loaded
        return np.asarray(array, dtype=dtype).reshape(shape)

    def describe(self) -> str:
        return ", ".join(f"{name} {list(shape)}" for name, shape in self.shapes.items())


def default_sample(signature: Signature) -> WarmupSample:
    """Zeros, 1 for every dynamic dimension: what edged warms up with when the manifest says nothing."""
    shapes = {spec.name: tuple(max(d, 1) for d in spec.shape) for spec in signature.inputs}
    return WarmupSample(shapes, {spec.name: spec.dtype for spec in signature.inputs})


def read_warmup(manifest: dict[str, Any], signature: Signature, folder: Path, where: str) -> tuple[WarmupSample, ...]:
    """The manifest's "warmup" samples, checked against the model's inputs (none if it gives none)."""
    raw = manifest.get("warmup")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise WarmupError(f'{where}: "warmup" must be a non-empty list of {{"shapes": ..., "data": ...}} samples')
    return tuple(_sample(item, signature, folder, f"{where}: warmup[{i}]") for i, item in enumerate(raw))


def _sample(item: Any, signature: Signature, folder: Path, where: str) -> WarmupSample:
    if not isinstance(item, dict) or set(item) - {"shapes", "data"}:
        raise WarmupError(f'{where} must be a map with "shapes" and optionally "data"')
    specs = {spec.name: spec for spec in signature.inputs}
    given = item.get("shapes", {})
    if not isinstance(given, dict):
        raise WarmupError(f'{where}.shapes must map input names to shapes, e.g. {{"input": [1, 512]}}')
    shapes = {}
    for name, spec in specs.items():
        shape = given.get(name, [max(d, 1) for d in spec.shape])
        _check_shape(spec, shape, f"{where}.shapes.{name}")
        shapes[name] = tuple(shape)
    unknown = sorted(set(given) - set(specs))
    if unknown:
        raise WarmupError(f"{where}.shapes names {unknown}, which the model does not take; it takes {sorted(specs)}")
    data = item.get("data", "zeros")
    by_input = data if isinstance(data, dict) else dict.fromkeys(specs, data)
    for name, how in by_input.items():
        if name not in specs:
            raise WarmupError(f"{where}.data names {name!r}, which the model does not take; it takes {sorted(specs)}")
        if isinstance(how, bool) or not isinstance(how, str | int | float):
            raise WarmupError(f'{where}.data.{name} = {how!r}: set "zeros", "random", a .npy/.npz file or a number')
        if isinstance(how, str) and how not in FILLS and not (folder / how).is_file():
            raise WarmupError(
                f'{where}.data.{name} = {how!r}: no such file beside the manifest; set "zeros", "random" or a file'
            )
    return WarmupSample(shapes, {spec.name: spec.dtype for spec in signature.inputs}, by_input, folder)


def _check_shape(spec: TensorSpec, shape: Any, key: str) -> None:
    ok = (
        isinstance(shape, list)
        and len(shape) == len(spec.shape)
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape)
        and all(want in (-1, got) for want, got in zip(spec.shape, shape))
    )
    if not ok:
        raise WarmupError(
            f"{key} = {shape!r}: set it to {len(spec.shape)} positive sizes matching {list(spec.shape)} (-1: any size)"
        )


def set_shapes_hint(signature: Signature) -> str:
    """Which shapes to set: each input with a dynamic dimension, as the manifest key to fill."""
    dynamic = [f'"{spec.name}": {list(spec.shape)}' for spec in signature.inputs if -1 in spec.shape]
    return (
        'set "warmup": [{"shapes": {' + ", ".join(dynamic) + "}}] in its manifest.json, with sizes it accepts "
        "in place of each -1"
    )


def tiled(sample: WarmupSample, signature: Signature, max_batch: int) -> list[tuple[dict[str, np.ndarray], int]]:
    """The calls a warm-up times for `sample`: as given, and at the class's largest batch
    where requests are batched (its rows repeated), so both ends of the estimate are seeded.
    A model whose cost follows its input's size is priced per row size, whatever the
    batch, so its sample is not tiled: the OCR detector warmed up at 320 and 640 pixels
    square took 36.7 s to start on the built-in classes tiled to 4, 8 and 16 rows, 3.4 s not
    (the 2-core VM, 2026-11-23)."""
    first = sample.inputs()
    rows = next(iter(first.values())).shape[0] if signature.batchable else 1
    calls = [(first, rows)]
    if signature.batchable and not signature.sized and max_batch > rows:
        calls.append((sample.inputs(max_batch), max_batch))
    return calls


def one_size_warning(name: str, signature: Signature, samples: tuple[WarmupSample, ...], manifest: Path | None) -> str:
    """For a model whose cost follows its input's size and that warms up at one size only:
    the sentence to log, since a request larger is priced in proportion until one as
    large has run, and a tiny warm-up then sheds every real-sized request ("" otherwise)."""
    if not signature.sized:
        return ""
    sizes = {_row_elements(sample, signature.batchable) for sample in samples}
    if len(sizes) > 1:
        return ""
    where = str(manifest) if manifest else "its manifest.json"
    return (
        f"model {name!r} takes inputs of any size and warms up at one size ({samples[0].describe()}): a larger "
        "request is priced in proportion to it until one as large has run, so one far larger may be shed in every "
        f'class; give "warmup" samples at the smallest and the largest sizes it serves in {where}'
    )


def _row_elements(sample: WarmupSample, batchable: bool) -> int:
    rows = next(iter(sample.shapes.values()))[0] if batchable else 1
    return sum(math.prod(shape) for shape in sample.shapes.values()) // rows


class ModelFailure(RuntimeError):
    """A model that failed to load or warm up: the message names it, the shapes tried and the key to set."""

    def __init__(self, model: str, message: str) -> None:
        super().__init__(message)
        self.model = model


def load_failure(name: str, path: Path, exc: BaseException) -> ModelFailure:
    return ModelFailure(name, f"model {name!r} failed to load from {path}: {_first_line(exc)}")


def warmup_failure(
    name: str, signature: Signature, sample: WarmupSample, manifest: Path | None, given: bool, exc: BaseException
) -> ModelFailure:
    where = str(manifest) if manifest else "its manifest.json"
    if given:
        fix = f'change "warmup" in {where} to shapes and data it accepts'
    else:
        fix = set_shapes_hint(signature).replace("its manifest.json", where)
    return ModelFailure(name, f"model {name!r} failed to warm up on {sample.describe()} ({_first_line(exc)}): {fix}")


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
