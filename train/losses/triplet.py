"""Triplet losses: squared-distance (FaceNet) and plain-distance (sampling-matters paper) forms.

The loss is the mean over ALL triplets used, zero-loss triplets included (pytorch-metric-learning's
TripletMarginLoss with a MeanReducer; its default AvgNonZeroReducer averages the non-zero ones).
Triplets come from `mined.triplets` when a miner gives them, else every valid triplet of the batch
(restricted to mined pair masks, if any) is used: for each positive pair (a, p) the hinge against
every negative of a, computed in chunks of positive pairs (see `all_triplets_hinge_mean`) so that no
B x B x B tensor is ever built.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from metricsearch.train.losses.registry import register
from metricsearch.train.losses.base import (
    MetricLoss,
    Mined,
    distances_from_similarity,
    pair_masks,
)

#: elements of one (positive pairs x B) chunk of the all-triplets hinge (2^22: 16 MiB in float32)
CHUNK_ELEMENTS = 1 << 22


class _AllTripletsHingeMean(torch.autograd.Function):
    """Mean over triplets (a, p, n), pos[a, p] & neg[a, n], of `[D_ap - D_an + margin]_+`.

    The forward pass walks the positive pairs in chunks of (pairs x B) hinges against every column,
    with the non-negatives of the anchor's row set to +inf (a zero hinge). The hinge is piecewise
    linear in D, so the gradient dL/dD (the count of active triplets each entry takes part in, over
    the triplet count) is accumulated in the same pass and is all that is kept for backward: memory
    is O(chunk + B^2) whatever the class structure. Its second derivative in D is 0 almost
    everywhere, so `grad_out * dL/dD` (differentiable in grad_out) is also right for double backward.
    """

    @staticmethod
    def forward(ctx: Any, dist: Tensor, pos: Tensor, neg: Tensor, margin: float) -> Tensor:
        anchors, positives = pos.nonzero(as_tuple=True)
        count = int((pos.sum(dim=1) * neg.sum(dim=1)).sum())
        total = dist.new_zeros(())
        grad = torch.zeros_like(dist) if ctx.needs_input_grad[0] else None
        if count > 0:
            # a non-negative column never wins the hinge: D_ap + margin - inf = -inf
            neg_dist = dist.masked_fill(~neg, float("inf"))
            rows = max(1, CHUNK_ELEMENTS // max(dist.shape[1], 1))
            for start in range(0, anchors.numel(), rows):
                a, p = anchors[start:start + rows], positives[start:start + rows]
                hinge = (dist[a, p] + margin)[:, None] - neg_dist[a]  # chunk x B
                if grad is not None:
                    active = (hinge > 0).to(dist.dtype)
                    grad.index_put_((a, p), active.sum(dim=1), accumulate=True)
                    grad.index_add_(0, a, active, alpha=-1)
                total = total + hinge.clamp_(min=0).sum()
        scale = 1.0 / max(count, 1)
        if grad is not None:
            ctx.save_for_backward(grad.mul_(scale))
        return total * scale

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, None, None, None]:
        (grad,) = ctx.saved_tensors
        return grad_out * grad, None, None, None


def all_triplets_hinge_mean(dist: Tensor, pos: Tensor, neg: Tensor, margin: float) -> Tensor:
    """Mean over all triplets with pos[a, p] and neg[a, n] of `[D_ap - D_an + margin]_+`; 0 if none.

    The value and gradient of `masked_mean(relu(D[:, :, None] - D[:, None, :] + margin),
    pos[:, :, None] & neg[:, None, :])` without its B x B x B tensors.
    """
    return _AllTripletsHingeMean.apply(dist, pos, neg, float(margin))


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

    def loss_from_similarity(self, sim: Tensor, labels: Tensor, mined: Mined | None = None) -> Tensor:
        dist = (2.0 - 2.0 * sim).clamp(min=0.0) if self.squared else distances_from_similarity(sim)
        if mined is not None and mined.triplets is not None:
            a, p, n = mined.triplets
            losses = F.relu(dist[a, p] - dist[a, n] + self.margin)
            return losses.sum() / max(losses.numel(), 1)
        pos, neg = pair_masks(labels, mined)
        return all_triplets_hinge_mean(dist, pos, neg, self.margin)


@register("triplet_l2")
class TripletL2Loss(TripletLoss):
    """Triplet loss on distances, `[D_ap - D_an + a]_+` (sampling-matters paper), mean over triplets."""

    squared: ClassVar[bool] = False
