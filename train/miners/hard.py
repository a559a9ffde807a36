"""Hard negative mining: the closest negative of each anchor, for every positive pair."""

from __future__ import annotations

import math

from torch import Tensor

from metricsearch.train.losses.base import Mined
from metricsearch.train.miners.base import Miner
from metricsearch.train.miners.registry import register_miner


@register_miner("hard")
class HardMiner(Miner):
    """Hard negative mining: per (a, p) the negative closest to the anchor."""

    def mine(self, sim: Tensor, pos: Tensor, neg: Tensor, dim: int) -> Mined:
        closest = sim.masked_fill(~neg, -math.inf).argmax(dim=1)  # highest similarity = closest
        anchor, positive = (pos & neg.any(dim=1, keepdim=True)).nonzero(as_tuple=True)
        return Mined(triplets=(anchor, positive, closest[anchor]))
