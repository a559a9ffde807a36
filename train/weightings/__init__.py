"""Weightings: how a pair loss's per-pair losses become the batch loss, built by name (`weighting.name`) from
WEIGHTINGS."""

from __future__ import annotations

from typing import Any

import metricsearch.train.losses  # noqa: F401  # first: its dro_* losses are built on the weightings of dro.py
from metricsearch.train.context import TrainContext
from metricsearch.train.weightings import dro, importance  # noqa: F401  # each module registers its weightings
from metricsearch.train.weightings.base import Weighting
from metricsearch.train.weightings.registry import WEIGHTINGS, register_weighting


def build_weighting(name: str, context: TrainContext | dict[str, Any] | None = None, **params: Any) -> Weighting:
    """A pair weighting (per-pair losses -> the batch loss) by registry name, given the context's fields it takes."""
    return WEIGHTINGS.build(name, context.as_dict() if isinstance(context, TrainContext) else context, **params)


__all__ = ["WEIGHTINGS", "Weighting", "build_weighting", "register_weighting"]
