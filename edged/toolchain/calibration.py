"""Calibration and held-out samples for the quantizers: from files, or drawn from a
described distribution (seeded, so a build is repeatable).

A calibration folder holds .npy files (one array, for a model with one input) or
.npz files (one array per input name); arrays are [N, ...] and are concatenated
along N in file-name order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edged.wire.codec import DTYPES, TensorSpec

Samples = dict[str, np.ndarray]
HELD_OUT_SEED = 1  # never the calibration seed: accuracy is checked on data the scales never saw


class CalibrationError(ValueError):
    """Calibration data that does not fit the model; the message says which file and why."""


def standard_normal(specs: tuple[TensorSpec, ...], count: int, seed: int) -> Samples:
    """`count` samples per input from N(0, 1); a dynamic dimension other than the batch is 1."""
    rng = np.random.default_rng(seed)
    return {
        spec.name: rng.standard_normal((count, *_fixed(spec)), dtype=np.float64).astype(DTYPES[spec.dtype])
        for spec in specs
    }


def held_out(specs: tuple[TensorSpec, ...], count: int) -> Samples:
    return standard_normal(specs, count, HELD_OUT_SEED)


def load_calibration(folder: Path, specs: tuple[TensorSpec, ...]) -> Samples:
    files = sorted(p for p in folder.glob("*") if p.suffix in (".npy", ".npz"))
    if not folder.is_dir() or not files:
        raise CalibrationError(f"calibration folder {folder} has no .npy or .npz files")
    parts: dict[str, list[np.ndarray]] = {spec.name: [] for spec in specs}
    for path in files:
        if path.suffix == ".npy":
            if len(specs) != 1:
                raise CalibrationError(f"{path}: a model with several inputs needs .npz files keyed by input name")
            arrays = {specs[0].name: np.load(path)}
        else:
            with np.load(path) as archive:
                arrays = {name: archive[name] for name in archive.files}
        for spec in specs:
            if spec.name not in arrays:
                raise CalibrationError(f"{path}: has no array for input {spec.name!r}")
            parts[spec.name].append(_checked(arrays[spec.name], spec, path))
    samples = {name: np.concatenate(chunks) for name, chunks in parts.items()}
    counts = {len(array) for array in samples.values()}
    if len(counts) != 1:
        raise CalibrationError(f"calibration folder {folder}: inputs have different sample counts {sorted(counts)}")
    return samples


def _fixed(spec: TensorSpec) -> tuple[int, ...]:
    return tuple(max(d, 1) for d in spec.shape[1:])


def _checked(array: np.ndarray, spec: TensorSpec, path: Path) -> np.ndarray:
    want = spec.shape[1:]
    got = array.shape[1:]
    if len(got) != len(want) or any(w not in (-1, g) for w, g in zip(want, got)):
        raise CalibrationError(f"{path}: {spec.name} has shape {list(array.shape)}, the model takes [N, {want}]")
    return array.astype(DTYPES[spec.dtype], copy=False)
