"""The sampler, miner and weighting registries: each sampling module registers its entries here by name."""

from __future__ import annotations

from typing import Callable

from metricsearch.registry import Registry
from metricsearch.train.losses.base import Mined, Weighting
from metricsearch.train.sampling.base import LabelBatchSampler

SAMPLERS: Registry[LabelBatchSampler] = Registry("sampler")
MINERS: Registry[Callable[..., Mined]] = Registry("miner")
WEIGHTINGS: Registry[Weighting] = Registry("weighting")
register_sampler = SAMPLERS.register
register_miner = MINERS.register
register_weighting = WEIGHTINGS.register
