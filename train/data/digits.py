"""scikit-learn's bundled 8x8 handwritten digits: classes 0-4 train, 5-9 test (always offline)."""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits

from .base import RECALL_K_SMALL, DataSplit, split_by_class


def load() -> DataSplit:
    """The digits split: 8x8 gray images scaled to 0..255, digits 0-4 train, 5-9 test."""
    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    keys = [int(t) for t in digits.target]
    return split_by_class("digits", list(images), keys, lambda d: d <= 4, RECALL_K_SMALL, mode="L")
