"""Every loss of the five papers, built by name: `build(name, **params)`, `names()`."""

from __future__ import annotations

from typing import Any

from metricsearch.registry import Registry
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


def build(name: str, **params: Any) -> MetricLoss:
    """A loss module by registry name; `class_counts` / `num_classes` / `num_images` reach only losses that take them."""
    context = {k: params.pop(k) for k in ("class_counts", "num_classes", "num_images") if k in params}
    return LOSSES.build(name, context, **params)


def names() -> list[str]:
    """Registered loss names."""
    return LOSSES.names()


__all__ = ["LOSSES", "MetricLoss", "Mined", "PairLoss", "Weighting", "build", "names",
           "register", "label_masks", "pair_masks"]
