"""Lifted structure losses: Song et al. 2016's original, the generalised form (MS paper eq. 6) and
the MS paper's LiftedStruct* (eq. 16), the latter optionally on MS-mined pairs (LiftedStruct*_m)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from metricsearch.train.losses.registry import register
from metricsearch.train.losses.base import (
    MetricLoss,
    Mined,
    check_positive,
    distances_from_similarity,
    masked_logsumexp,
    masked_mean,
    pair_masks,
)
from metricsearch.train.losses.ms import check_epsilon, ms_pairs


def lifted_star_terms(sim: Tensor, pos: Tensor, neg: Tensor, alpha: float, beta: float) -> Tensor:
    """Per-anchor LiftedStruct* terms (eq. 16 before the 1/m); 0 for anchors lacking positives or
    negatives, where the log of an empty sum is undefined."""
    pos_term = masked_logsumexp(-alpha * sim, pos, dim=1) / alpha
    neg_term = masked_logsumexp(beta * sim, neg, dim=1) / beta
    valid = pos.any(dim=1) & neg.any(dim=1)
    return torch.where(valid, pos_term + neg_term, torch.zeros_like(pos_term))


@register("lifted")
class LiftedStructureLoss(MetricLoss):
    """Song et al. 2016's lifted structure loss on Euclidean distances of the normalised embeddings.

    Per positive pair J_ij = log(sum_{k in N_i} e^{a - D_ik} + sum_{l in N_j} e^{a - D_jl}) + D_ij;
    L = 1/(2|P|) sum_{P} [J_ij]_+^2 over the |P| unordered positive pairs (equivalently half the
    mean over ordered pairs), as pytorch-metric-learning's LiftedStructureLoss(neg_margin=a).
    """

    def __init__(self, margin: float = 1.0) -> None:
        super().__init__()
        check_positive(margin=margin)
        self.margin = margin

    def loss_from_similarity(self, sim: Tensor, labels: Tensor, mined: Mined | None = None) -> Tensor:
        pos, neg = pair_masks(labels, mined)
        dist = distances_from_similarity(sim)
        # anchors without negatives sit at the lowest finite value, not -inf: logaddexp of two
        # -inf has a NaN gradient
        lse = masked_logsumexp(self.margin - dist, neg, dim=1).clamp(min=torch.finfo(dist.dtype).min)
        hinge = torch.relu(torch.logaddexp(lse[:, None], lse[None, :]) + dist)
        return masked_mean(hinge.square(), pos) / 2


@register("generalized_lifted")
class GeneralizedLiftedStructureLoss(MetricLoss):
    """Generalised lifted structure loss (MS paper eq. 6) on cosine similarities.

    Per anchor [log sum_{P_i} e^{l - S_ik} + log sum_{N_i} e^{S_ik}]_+ (0 for anchors lacking
    positives or negatives). Eq. 6 sums over anchors; we take the mean (1/m), which is
    pytorch-metric-learning's GeneralizedLiftedStructureLoss(pos_margin=l, neg_margin=0,
    distance=CosineSimilarity()) with its MeanReducer, and keeps the scale batch-size free.
    """

    def __init__(self, margin: float = 1.0) -> None:
        super().__init__()
        if not math.isfinite(margin):
            raise ValueError(f"margin must be a finite number, got {margin!r}")
        self.margin = margin

    def loss_from_similarity(self, sim: Tensor, labels: Tensor, mined: Mined | None = None) -> Tensor:
        pos, neg = pair_masks(labels, mined)
        lse = masked_logsumexp(self.margin - sim, pos, dim=1) + masked_logsumexp(sim, neg, dim=1)
        valid = pos.any(dim=1) & neg.any(dim=1)
        return torch.where(valid, torch.relu(lse), torch.zeros_like(lse)).mean()


@register("lifted_star")
class LiftedStarLoss(MetricLoss):
    """LiftedStruct* (MS paper eq. 16), on all pairs or on the MS-mined pairs.

    1/m sum_i {1/a log sum_{P_i} e^{-a S_ik} + 1/b log sum_{N_i} e^{b S_ik}}. With `mining` the
    sums run over the MS-mined pairs (the paper's LiftedStruct*_m). Anchors lacking positives or
    negatives contribute 0 but still count in m.
    """

    def __init__(
        self, alpha: float = 2.0, beta: float = 50.0, mining: bool = False, epsilon: float = 0.1
    ) -> None:
        super().__init__()
        check_positive(alpha=alpha, beta=beta)
        check_epsilon(epsilon)
        self.alpha, self.beta, self.mining, self.epsilon = alpha, beta, mining, epsilon

    def loss_from_similarity(self, sim: Tensor, labels: Tensor, mined: Mined | None = None) -> Tensor:
        pos, neg = ms_pairs(sim, labels, mined, self.mining, self.epsilon)
        return lifted_star_terms(sim, pos, neg, self.alpha, self.beta).mean()


@register("lifted_star_ms")
def lifted_star_ms(alpha: float = 2.0, beta: float = 50.0, epsilon: float = 0.1) -> LiftedStarLoss:
    """LiftedStruct*_m (MS paper Table 2): LiftedStruct* on the MS-mined pairs."""
    return LiftedStarLoss(alpha=alpha, beta=beta, mining=True, epsilon=epsilon)
