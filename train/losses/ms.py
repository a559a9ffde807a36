"""Multi-similarity loss (Wang et al. 2019): MS mining (Similarity-P) then MS weighting (eq. 15)."""

from __future__ import annotations

import torch
from torch import Tensor

from metricsearch.train.losses import register
from metricsearch.train.losses.base import MetricLoss, Mined, Reduction, masked_logsumexp, pair_masks


def ms_mine(sim: Tensor, pos: Tensor, neg: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """The MS mining step: keep negatives harder than the hardest positive minus epsilon, and
    positives harder than the hardest negative plus epsilon (eq. 11 with the index-set typo fixed)."""
    s = sim.detach()
    big = torch.finfo(s.dtype).max
    min_pos = s.masked_fill(~pos, big).amin(dim=1, keepdim=True)
    max_neg = s.masked_fill(~neg, -big).amax(dim=1, keepdim=True)
    return pos & (s < max_neg + epsilon), neg & (s > min_pos - epsilon)


def log1p_sum_exp(values: Tensor, mask: Tensor) -> Tensor:
    """Row-wise log(1 + sum_{mask} exp(values)), stable (log-sum-exp with an implicit zero)."""
    lse = masked_logsumexp(values, mask, dim=1)
    return torch.logaddexp(lse, torch.zeros_like(lse))


@register("ms")
class MultiSimilarityLoss(MetricLoss):
    """Multi-similarity loss: MS pair mining then soft weighting by self and relative similarity (eq. 15)."""

    def __init__(
        self, alpha: float = 2.0, beta: float = 50.0, base: float = 0.5, epsilon: float = 0.1,
        mining: bool = True,
    ) -> None:
        super().__init__()
        if alpha <= 0 or beta <= 0:
            raise ValueError(f"alpha and beta must be positive, got alpha={alpha}, beta={beta}")
        if epsilon < 0:
            raise ValueError(f"epsilon must be >= 0, got {epsilon}")
        self.alpha, self.beta, self.base, self.epsilon = alpha, beta, base, epsilon
        self.mining = mining

    def loss_from_similarity(
        self, sim: Tensor, labels: Tensor, mined: Mined | None, reduction: Reduction | None
    ) -> Tensor:
        pos, neg = pair_masks(labels, mined)
        if self.mining:
            pos, neg = ms_mine(sim, pos, neg, self.epsilon)
        pos_term = log1p_sum_exp(-self.alpha * (sim - self.base), pos) / self.alpha
        neg_term = log1p_sum_exp(self.beta * (sim - self.base), neg) / self.beta
        return (pos_term + neg_term).mean()
