"""Every loss of the five papers, built by name: `build(name, **params)`, `names()`."""

from __future__ import annotations

from typing import Any

from metricsearch.registry import Registry
from metricsearch.train.context import TrainContext
from metricsearch.train.losses.base import (
    MetricLoss,
    Mined,
    PairLoss,
    Weighting,
    label_masks,
    pair_masks,
)

LOSSES: Registry[MetricLoss] = Registry("loss")
register = LOSSES.register

# Importing the modules registers their losses.
from metricsearch.train.losses import ms, contrastive, dro, margin, npair, triplet, binomial, ice, lifted  # noqa: E402,F401


def build(name: str, context: TrainContext | None = None, **params: Any) -> MetricLoss:
    """A loss module by registry name; the training context's fields reach only the losses that take them."""
    return LOSSES.build(name, context.as_dict() if context is not None else None, **params)


def names() -> list[str]:
    """Registered loss names."""
    return LOSSES.names()


__all__ = ["LOSSES", "MetricLoss", "Mined", "PairLoss", "Weighting", "build", "names",
           "register", "label_masks", "pair_masks"]
