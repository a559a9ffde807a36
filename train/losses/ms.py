"""Multi-similarity loss (Wang et al. 2019): MS mining (Similarity-P) then MS weighting (eq. 15),
and the paper's two MS ablations (Table 2): MS mining alone and MS weighting alone."""

from __future__ import annotations

import torch
from torch import Tensor

from metricsearch.train.losses.registry import register
from metricsearch.train.losses.base import (
    MetricLoss,
    Mined,
    check_positive,
    masked_logsumexp,
    pair_masks,
    reference_masks,
)


def ms_mine(sim: Tensor, pos: Tensor, neg: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """The MS mining step: keep negatives harder than the hardest positive minus epsilon, and
    positives harder than the hardest negative plus epsilon (eq. 11 with the index-set typo fixed)."""
    s = sim.detach()
    big = torch.finfo(s.dtype).max
    min_pos = s.masked_fill(~pos, big).amin(dim=1, keepdim=True)
    max_neg = s.masked_fill(~neg, -big).amax(dim=1, keepdim=True)
    return pos & (s < max_neg + epsilon), neg & (s > min_pos - epsilon)


def ms_pairs(
    sim: Tensor, labels: Tensor, mined: Mined | None, mining: bool, epsilon: float
) -> tuple[Tensor, Tensor]:
    """Positive and negative masks of a batch (restricted to `mined`), MS-mined when `mining`."""
    pos, neg = pair_masks(labels, mined)
    return ms_mine(sim, pos, neg, epsilon) if mining else (pos, neg)


def check_epsilon(epsilon: float) -> None:
    """Raise a ValueError unless the MS mining margin epsilon is >= 0."""
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")


def log1p_sum_exp(values: Tensor, mask: Tensor) -> Tensor:
    """Row-wise log(1 + sum_{mask} exp(values)), stable (log-sum-exp with an implicit zero)."""
    lse = masked_logsumexp(values, mask, dim=1)
    return torch.logaddexp(lse, torch.zeros_like(lse))


@register("ms")
class MultiSimilarityLoss(MetricLoss):
    """Multi-similarity loss: MS pair mining then soft weighting by self and relative similarity (eq. 15).

    Normalised by 1/m over all m anchors of the batch (eq. 15), like pytorch-metric-learning's
    MultiSimilarityLoss with its default MeanReducer over anchors.
    """

    def __init__(
        self, alpha: float = 2.0, beta: float = 50.0, base: float = 0.5, epsilon: float = 0.1,
        mining: bool = True,
    ) -> None:
        super().__init__()
        check_positive(alpha=alpha, beta=beta)
        check_epsilon(epsilon)
        self.alpha, self.beta, self.base, self.epsilon = alpha, beta, base, epsilon
        self.mining = mining

    def loss_from_similarity(self, sim: Tensor, labels: Tensor, mined: Mined | None = None) -> Tensor:
        return self.anchor_mean(sim, *pair_masks(labels, mined))

    def loss_against(self, embeddings: Tensor, labels: Tensor, refs: Tensor, ref_labels: Tensor) -> Tensor:
        """Eq. 15 with each anchor's pairs taken among the batch and `refs` (a cross-batch memory)."""
        sim = self.similarity(embeddings, torch.cat([embeddings, refs.to(embeddings.dtype)]))
        return self.anchor_mean(sim, *reference_masks(labels, ref_labels))

    def anchor_mean(self, sim: Tensor, pos: Tensor, neg: Tensor) -> Tensor:
        """Eq. 15 over the rows (anchors) of `sim`, MS-mined among `pos` / `neg` when mining is on."""
        if self.mining:
            pos, neg = ms_mine(sim, pos, neg, self.epsilon)
        pos_term = log1p_sum_exp(-self.alpha * (sim - self.base), pos) / self.alpha
        neg_term = log1p_sum_exp(self.beta * (sim - self.base), neg) / self.beta
        return (pos_term + neg_term).mean()


@register("ms_weighting")
def ms_weighting(alpha: float = 2.0, beta: float = 50.0, base: float = 0.5) -> MultiSimilarityLoss:
    """MS ablation "MS weighting": eq. 15 on every pair of the batch, without MS mining."""
    return MultiSimilarityLoss(alpha=alpha, beta=beta, base=base, mining=False)


@register("ms_mining")
class MSMiningLoss(MetricLoss):
    """MS ablation "MS mining": the MS-mined pairs, every kept pair with the same weight.

    L = 1/m sum_i [sum_{kept N_i} (1 + S_ik) + sum_{kept P_i} (1 - S_ik)], linear in S, so
    |dL/dS_ik| = 1/m on every kept pair and 0 elsewhere (the constants keep L >= 0 and do not
    change the gradient).
    """

    def __init__(self, epsilon: float = 0.1) -> None:
        super().__init__()
        check_epsilon(epsilon)
        self.epsilon = epsilon

    def loss_from_similarity(self, sim: Tensor, labels: Tensor, mined: Mined | None = None) -> Tensor:
        pos, neg = ms_pairs(sim, labels, mined, True, self.epsilon)
        zero = torch.zeros_like(sim)
        per_pair = torch.where(neg, 1.0 + sim, zero) + torch.where(pos, 1.0 - sim, zero)
        return per_pair.sum() / sim.shape[0]
