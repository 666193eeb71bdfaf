"""The demo ensemble's Python steps (engines/demo-ensemble/pipeline.toml)."""

from __future__ import annotations

import numpy as np


def pool(image: np.ndarray) -> dict[str, np.ndarray]:
    """64 features from a [n, 3, 64, 64] image: the channels' mean over each 8x8 block."""
    n = image.shape[0]
    blocks = image.mean(axis=1).reshape(n, 8, 8, 8, 8).mean(axis=(2, 4))
    return {"x": blocks.reshape(n, 64).astype(np.float32)}


def join(heavy: np.ndarray, light: np.ndarray) -> dict[str, np.ndarray]:
    """The mean of the two branches' softmax probabilities."""
    return {"probabilities": ((_softmax(heavy) + _softmax(light)) / 2).astype(np.float32)}


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)
