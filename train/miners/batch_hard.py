"""Batch-hard mining (Hermans et al. 2017): the farthest positive and the closest negative of each anchor."""

from __future__ import annotations

import math

from torch import Tensor

from metricsearch.train.losses.base import Mined
from metricsearch.train.miners.base import Miner
from metricsearch.train.miners.registry import register_miner


@register_miner("batch_hard")
class BatchHardMiner(Miner):
    """Batch-hard mining: per anchor the farthest positive and the closest negative."""

    def mine(self, sim: Tensor, pos: Tensor, neg: Tensor, dim: int) -> Mined:
        anchor = (pos.any(dim=1) & neg.any(dim=1)).nonzero(as_tuple=True)[0]
        farthest = sim.masked_fill(~pos, math.inf).argmin(dim=1)
        closest = sim.masked_fill(~neg, -math.inf).argmax(dim=1)
        return Mined(triplets=(anchor, farthest[anchor], closest[anchor]))
