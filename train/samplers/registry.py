"""The sampler registry: each sampler module registers its batch sampler here by name."""

from __future__ import annotations

from metricsearch.registry import Registry
from metricsearch.train.samplers.base import LabelBatchSampler

SAMPLERS: Registry[LabelBatchSampler] = Registry("sampler")
register_sampler = SAMPLERS.register
