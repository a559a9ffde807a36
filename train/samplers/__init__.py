"""Batch samplers: which images each training batch holds, built by name (`sampler.name`) from SAMPLERS."""

from __future__ import annotations

from typing import Any

import numpy as np

from metricsearch.train.samplers import (  # noqa: F401  # each module registers its sampler
    group, hard_class, p_random, random_batches, super_class,
)
from metricsearch.train.samplers.base import Design, LabelBatchSampler
from metricsearch.train.samplers.registry import SAMPLERS, register_sampler


def build_sampler(name: str, labels: np.ndarray, groups: np.ndarray | None = None, **params: Any) -> LabelBatchSampler:
    """A batch sampler over `labels` by registry name; `groups` (each image's super-class) goes to those taking it."""
    return SAMPLERS.build(name, {"groups": groups}, labels=labels, **params)


__all__ = ["SAMPLERS", "Design", "LabelBatchSampler", "build_sampler", "register_sampler"]
