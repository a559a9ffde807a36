"""The loss registry: each loss module registers its losses here by name."""

from __future__ import annotations

from metricsearch.registry import Registry
from metricsearch.train.losses.base import MetricLoss

LOSSES: Registry[MetricLoss] = Registry("loss")
register = LOSSES.register
