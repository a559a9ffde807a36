"""Miners: which pairs or triplets of a batch the loss uses, built by name (`miner.name`) from MINERS."""

from __future__ import annotations

from typing import Any, Callable

from metricsearch.train.losses.base import Mined
from metricsearch.train.miners.base import Miner, SeededMiner
from metricsearch.train.miners.batch_hard import BatchHardMiner
from metricsearch.train.miners.distance_weighted import DistanceWeightedMiner
from metricsearch.train.miners.hard import HardMiner
from metricsearch.train.miners.ms import MSMiner
from metricsearch.train.miners.random_subset import RandomMiner
from metricsearch.train.miners.semihard import SemiHardMiner
from metricsearch.train.miners.registry import MINERS, register_miner


def build_miner(name: str, **params: Any) -> Callable[..., Mined]:
    """A miner `(embeddings, labels) -> Mined` by registry name."""
    return MINERS.build(name, None, **params)


__all__ = ["MINERS", "BatchHardMiner", "DistanceWeightedMiner", "HardMiner", "MSMiner", "Mined", "Miner", "RandomMiner",
           "SeededMiner", "SemiHardMiner", "build_miner", "register_miner"]
