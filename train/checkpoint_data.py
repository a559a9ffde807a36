"""What a run's checkpoint says about its data: the run's split, and a sample batch of its test images."""

from __future__ import annotations

from typing import Any

import numpy as np

from metricsearch.data import DataSplit, ImageSet, load_split
from metricsearch.models.preprocessing import Preprocessing


def run_split(state: dict[str, Any], dataset: str | None = None) -> DataSplit:
    """The data split of a checkpoint's saved config, or of `dataset` when one is given."""
    saved = state.get("config", {})
    spec = dataset or saved.get("dataset")
    if not spec:
        raise ValueError("the checkpoint names no data set: pass --dataset SPEC")
    if dataset:
        return load_split(spec)
    return load_split(spec, split_classes=saved.get("split_classes"), split=saved.get("split", "test"),
                      val_classes=saved.get("val_classes"), seed=saved.get("seed", 0))  # the run's training classes


def sample_batch(preprocessing: Preprocessing, images: ImageSet, n: int) -> np.ndarray:
    """n images spread evenly over an ImageSet, preprocessed (N x C x H x W float32)."""
    if n < 1:
        raise ValueError(f"the sample batch needs at least 1 image, got {n}")
    idx = np.linspace(0, len(images) - 1, num=min(n, len(images))).round().astype(int)
    return preprocessing.batch([images.load(int(i)) for i in idx])
