"""The miner registry: each miner module registers its miner here by name."""

from __future__ import annotations

from typing import Callable

from metricsearch.registry import Registry
from metricsearch.train.losses.base import Mined

MINERS: Registry[Callable[..., Mined]] = Registry("miner")
register_miner = MINERS.register
