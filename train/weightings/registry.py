"""The weighting registry: each weighting module registers its weightings here by name."""

from __future__ import annotations

from metricsearch.registry import Registry
from metricsearch.train.weightings.base import Weighting

WEIGHTINGS: Registry[Weighting] = Registry("weighting")
register_weighting = WEIGHTINGS.register
