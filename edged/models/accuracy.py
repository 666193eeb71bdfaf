"""How far one form of a model answers from another on the same inputs: the figures of
the quantizer's check (against FP32) and of the CPU backend's INT8 kernel check."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Accuracy:
    """How far a candidate's outputs are from a reference's, row by row."""

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
    """Accuracy of `candidate` against `reference`, both [N, ...] (one row per sample)."""
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
