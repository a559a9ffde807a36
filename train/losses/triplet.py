"""Triplet losses: squared-distance (FaceNet) and plain-distance (sampling-matters paper) forms.

The loss is the mean over ALL triplets used, zero-loss triplets included (pytorch-metric-learning's
TripletMarginLoss with a MeanReducer; its default AvgNonZeroReducer averages the non-zero ones).
Triplets come from `mined.triplets` when a miner gives them, else every valid triplet of the batch
(restricted to mined pair masks, if any) is used, vectorised as a B x B x B tensor.
"""

from __future__ import annotations

from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor

from metricsearch.train.losses import register
from metricsearch.train.losses.base import (
    MetricLoss,
    Mined,
    Reduction,
    distances_from_similarity,
    masked_mean,
    pair_masks,
)


@register("triplet")
class TripletLoss(MetricLoss):
    """Triplet loss on squared distances, `[D_ap^2 - D_an^2 + a]_+` (FaceNet), mean over triplets."""

    mines: ClassVar[str] = "triplets"
    #: whether the triplet compares squared distances (FaceNet) or distances
    squared: ClassVar[bool] = True

    def __init__(self, margin: float = 0.2) -> None:
        super().__init__()
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        self.margin = margin

    def loss_from_similarity(
        self, sim: Tensor, labels: Tensor, mined: Mined | None, reduction: Reduction | None
    ) -> Tensor:
        dist = (2.0 - 2.0 * sim).clamp(min=0.0) if self.squared else distances_from_similarity(sim)
        if mined is not None and mined.triplets is not None:
            a, p, n = mined.triplets
            losses = F.relu(dist[a, p] - dist[a, n] + self.margin)
            return losses.sum() / max(losses.numel(), 1)
        pos, neg = pair_masks(labels, mined)
        losses = F.relu(dist[:, :, None] - dist[:, None, :] + self.margin)
        return masked_mean(losses, pos[:, :, None] & neg[:, None, :])


@register("triplet_l2")
class TripletL2Loss(TripletLoss):
    """Triplet loss on distances, `[D_ap - D_an + a]_+` (sampling-matters paper), mean over triplets."""

    squared: ClassVar[bool] = False
