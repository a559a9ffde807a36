"""Distributionally robust pair weightings (Qi et al., DRO framework) and the dro_* losses.

The three weightings are reductions `(losses, pos, neg, labels) -> scalar` over the per-pair
losses of any pair loss: TopK (mean of the K largest), TopK-PN (sum of the K/2 largest positive
and the K/2 largest negative ones; the paper's p is in {0, 1}, so a sum) and KL
(`gamma * log mean exp(l / gamma)`). A dro_* loss is a base pair loss plus one of them.
"""

from __future__ import annotations

from numbers import Integral
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from metricsearch.train.losses import LOSSES, register
from metricsearch.train.losses.base import PairLoss, Reduction, check_positive, masked_logsumexp


def masked_topk_sum(losses: Tensor, mask: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Sum of the k largest `losses` under `mask`, and how many were summed (min(k, mask count))."""
    flat = losses.flatten().masked_fill(~mask.flatten(), float("-inf"))
    top = flat.topk(min(k, flat.numel())).values
    count = mask.sum().clamp(max=k)
    keep = torch.arange(top.numel(), device=top.device) < count
    return torch.where(keep, top, torch.zeros_like(top)).sum(), count


def check_k(k: int, least: int) -> None:
    """Raise a ValueError unless k is an integer >= least."""
    if isinstance(k, bool) or not isinstance(k, Integral) or k < least:
        raise ValueError(f"k must be an integer >= {least}, got {k!r}")


class TopKReduction:
    """DRO-TopK: mean of the K largest pair losses (the mean of all pairs when there are <= K)."""

    def __init__(self, k: int) -> None:
        check_k(k, 1)
        self.k = k

    def __call__(self, losses: Tensor, pos: Tensor, neg: Tensor, labels: Tensor) -> Tensor:
        total, count = masked_topk_sum(losses, pos | neg, self.k)
        return total / count.clamp(min=1)


class TopKPNReduction:
    """DRO-TopK-PN: sum of the K/2 largest positive and the K/2 largest negative pair losses."""

    def __init__(self, k: int) -> None:
        check_k(k, 2)
        self.k = k

    def __call__(self, losses: Tensor, pos: Tensor, neg: Tensor, labels: Tensor) -> Tensor:
        pos_total, _ = masked_topk_sum(losses, pos, self.k // 2)
        neg_total, _ = masked_topk_sum(losses, neg, self.k // 2)
        return pos_total + neg_total


class KLReduction:
    """DRO-KL: `gamma * log mean exp(l / gamma)` over the pairs (-> mean as gamma grows, max as it shrinks)."""

    def __init__(self, gamma: float) -> None:
        check_positive(gamma=gamma)
        self.gamma = gamma

    def __call__(self, losses: Tensor, pos: Tensor, neg: Tensor, labels: Tensor) -> Tensor:
        mask = (pos | neg).flatten()
        count = mask.sum()
        lse = masked_logsumexp(losses.flatten() / self.gamma, mask, dim=0)
        value = self.gamma * (lse - torch.log(count.clamp(min=1).to(losses.dtype)))
        return torch.where(count > 0, value, torch.zeros_like(value))


class SimilarityMarginLoss(PairLoss):
    """The DRO paper's base pair loss `[a + y_ij (lam - S_ij)]_+`, y = +1 positive, -1 negative.

    The paper gives no values; margin a = 0.1 and lam = 0.5 ask for S >= 0.6 on positives and
    S <= 0.4 on negatives.
    """

    def __init__(self, margin: float = 0.1, lam: float = 0.5) -> None:
        super().__init__()
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        self.margin, self.lam = margin, lam

    def pair_losses(self, sim: Tensor, labels: Tensor, pos: Tensor, neg: Tensor) -> Tensor:
        y = pos.to(sim.dtype) * 2.0 - 1.0
        return F.relu(self.margin + y * (self.lam - sim))


def build_base(
    base: str | None,
    base_params: dict[str, Any] | None,
    class_counts: dict[int, int] | None,
    num_classes: int | None,
) -> PairLoss:
    """The base pair loss of a DRO loss: the paper's margin loss (None) or a registered pair loss."""
    params = dict(base_params or {})
    if base is None:
        return SimilarityMarginLoss(**params)
    if base not in LOSSES.names():
        raise ValueError(
            f"base must name a registered pair loss, got {base!r}; known: {LOSSES.names()}"
        )
    context = {"class_counts": class_counts, "num_classes": num_classes}
    context = {k: v for k, v in context.items() if v is not None}
    loss = LOSSES.build(base, context, **params)
    if not isinstance(loss, PairLoss):
        raise ValueError(f"base must be a pair loss, {base!r} is not")
    return loss


class DROLoss(PairLoss):
    """A base pair loss whose mean over pairs is replaced by a DRO weighting."""

    def __init__(
        self,
        weighting: Reduction,
        base: str | None,
        base_params: dict[str, Any] | None,
        class_counts: dict[int, int] | None,
        num_classes: int | None,
    ) -> None:
        super().__init__()
        self.weighting = weighting
        self.base = build_base(base, base_params, class_counts, num_classes)
        self.normalize = self.base.normalize

    def pair_losses(self, sim: Tensor, labels: Tensor, pos: Tensor, neg: Tensor) -> Tensor:
        return self.base.pair_losses(sim, labels, pos, neg)

    def reduce(self, losses: Tensor, pos: Tensor, neg: Tensor, labels: Tensor) -> Tensor:
        """The DRO weighting of the pair losses."""
        return self.weighting(losses, pos, neg, labels)


@register("dro_topk")
class DROTopKLoss(DROLoss):
    """DRO-TopK: mean of the K largest pair losses of the batch (base: the paper's margin loss, or `base`)."""

    def __init__(
        self,
        k: int = 100,
        base: str | None = None,
        base_params: dict[str, Any] | None = None,
        class_counts: dict[int, int] | None = None,
        num_classes: int | None = None,
    ) -> None:
        super().__init__(TopKReduction(k), base, base_params, class_counts, num_classes)


@register("dro_topk_pn")
class DROTopKPNLoss(DROLoss):
    """DRO-TopK-PN: sum of the K/2 largest positive and K/2 largest negative pair losses."""

    def __init__(
        self,
        k: int = 100,
        base: str | None = None,
        base_params: dict[str, Any] | None = None,
        class_counts: dict[int, int] | None = None,
        num_classes: int | None = None,
    ) -> None:
        super().__init__(TopKPNReduction(k), base, base_params, class_counts, num_classes)


@register("dro_kl")
class DROKLLoss(DROLoss):
    """DRO-KL: `gamma * log mean exp(l / gamma)` of the pair losses (a soft maximum)."""

    def __init__(
        self,
        gamma: float = 0.1,
        base: str | None = None,
        base_params: dict[str, Any] | None = None,
        class_counts: dict[int, int] | None = None,
        num_classes: int | None = None,
    ) -> None:
        super().__init__(KLReduction(gamma), base, base_params, class_counts, num_classes)
