"""The multi-similarity paper's mining step as a pair miner for any pair loss."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from metricsearch.train.losses.base import Mined
from metricsearch.train.losses.ms import ms_mine
from metricsearch.train.miners.base import Miner
from metricsearch.train.miners.registry import register_miner


@register_miner("ms")
class MSMiner(Miner):
    """The multi-similarity mining step (`ms_mine`) as a pair miner for any pair loss."""

    produces: ClassVar[str] = "pairs"

    def __init__(self, epsilon: float = 0.1) -> None:
        if epsilon < 0:
            raise ValueError(f"epsilon must be >= 0, got {epsilon}")
        self.epsilon = epsilon

    def mine(self, sim: Tensor, pos: Tensor, neg: Tensor, dim: int) -> Mined:
        kept_pos, kept_neg = ms_mine(sim, pos, neg, self.epsilon)
        return Mined(pos=kept_pos, neg=kept_neg)
