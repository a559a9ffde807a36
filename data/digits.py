"""The embedded default: 1,797 8x8 handwritten digits, classes 0-4 train, 5-9 test (always offline).

`digits.npz` beside this file holds the UCI optical-recognition digits as scikit-learn bundles
them (`sklearn.datasets.load_digits`, BSD licence), scaled from 0..16 to 0..255 uint8, so that
the default needs neither scikit-learn nor a download.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .base import RECALL_K_SMALL, DataSplit, split_by_class

DIGITS_FILE = Path(__file__).with_name("digits.npz")


def load() -> DataSplit:
    """The digits split: 8x8 gray images (0..255), digits 0-4 train, 5-9 test."""
    with np.load(DIGITS_FILE) as f:
        images, labels = f["images"], f["labels"]
    keys = [int(t) for t in labels]
    return split_by_class("digits", list(images), keys, lambda d: d <= 4, RECALL_K_SMALL, mode="L")
