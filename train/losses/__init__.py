"""Every loss of the five papers, built by name: `build(name, **params)`, `names()`."""

from __future__ import annotations

from typing import Any

from metricsearch.train.context import TrainContext
from metricsearch.train.losses import (  # noqa: F401  # each module registers its losses in LOSSES
    binomial, contrastive, dro, ice, lifted, margin, ms, npair, triplet,
)
from metricsearch.train.losses.base import MetricLoss, Mined, PairLoss, Weighting, label_masks, pair_masks
from metricsearch.train.losses.registry import LOSSES, register


def build(name: str, context: TrainContext | None = None, **params: Any) -> MetricLoss:
    """A loss module by registry name; the training context's fields reach only the losses that take them."""
    return LOSSES.build(name, context.as_dict() if context is not None else None, **params)


def names() -> list[str]:
    """Registered loss names."""
    return LOSSES.names()


__all__ = ["LOSSES", "MetricLoss", "Mined", "PairLoss", "Weighting", "build", "names",
           "register", "label_masks", "pair_masks"]
