"""Batch samplers, miners and pair weightings, each built by name from its registry."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from metricsearch.train.context import TrainContext
from metricsearch.train.losses.base import Mined, Weighting
from metricsearch.train.sampling import (  # noqa: F401  # each module registers its entries
    distance_weighted, dro, group, hard_class, importance, miners, p_random, random_batches, super_class,
)
from metricsearch.train.sampling.base import LabelBatchSampler
from metricsearch.train.sampling.registry import (
    MINERS, SAMPLERS, WEIGHTINGS, register_miner, register_sampler, register_weighting,
)


def build_sampler(name: str, labels: np.ndarray, groups: np.ndarray | None = None, **params: Any) -> LabelBatchSampler:
    """A batch sampler over `labels` by registry name; `groups` (each image's super-class) goes to those taking it."""
    return SAMPLERS.build(name, {"groups": groups}, labels=labels, **params)


def build_miner(name: str, **params: Any) -> Callable[..., Mined]:
    """A miner `(embeddings, labels) -> Mined` by registry name."""
    return MINERS.build(name, None, **params)


def build_weighting(name: str, context: TrainContext | dict[str, Any] | None = None, **params: Any) -> Weighting:
    """A pair weighting (per-pair losses -> the batch loss) by registry name, given the context's fields it takes."""
    return WEIGHTINGS.build(name, context.as_dict() if isinstance(context, TrainContext) else context, **params)


__all__ = ["MINERS", "SAMPLERS", "WEIGHTINGS", "LabelBatchSampler", "Mined", "TrainContext", "Weighting", "build_miner",
           "build_sampler", "build_weighting", "register_miner", "register_sampler", "register_weighting"]
