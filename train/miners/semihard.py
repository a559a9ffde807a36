"""Semi-hard negative mining (FaceNet, Schroff et al. 2015)."""

from __future__ import annotations

import torch
from torch import Tensor

from metricsearch.train.losses.base import Mined, distances_from_similarity
from metricsearch.train.miners.base import Miner, row_table
from metricsearch.train.miners.registry import register_miner


@register_miner("semihard")
class SemiHardMiner(Miner):
    """FaceNet semi-hard: per (a, p) the closest negative with D_an > D_ap (and D_an < D_ap + margin)."""

    def __init__(self, margin: float | None = None) -> None:
        if margin is not None and margin <= 0:
            raise ValueError(f"margin must be positive or None, got {margin}")
        self.margin = margin

    def mine(self, sim: Tensor, pos: Tensor, neg: Tensor, dim: int) -> Mined:
        dist = distances_from_similarity(sim)
        pos_idx, pos_ok = row_table(pos)
        d_ap = dist.gather(1, pos_idx)
        # negatives of each anchor sorted by distance, non-negatives pushed to +inf at the end
        neg_sorted, neg_order = dist.masked_fill(~neg, float("inf")).sort(dim=1)
        first = torch.searchsorted(neg_sorted, d_ap.contiguous(), right=True)  # first D_an > D_ap
        ok = pos_ok & (first < neg.sum(dim=1, keepdim=True))
        first = first.clamp(max=dist.shape[1] - 1)
        if self.margin is not None:
            ok &= neg_sorted.gather(1, first) < d_ap + self.margin
        anchor = torch.arange(dist.shape[0], device=dist.device)[:, None].expand_as(pos_idx)
        return Mined(triplets=(anchor[ok], pos_idx[ok], neg_order.gather(1, first)[ok]))
