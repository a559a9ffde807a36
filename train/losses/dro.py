"""Distributionally robust pair weightings (Qi et al., DRO framework) and the dro_* losses.

The three weightings map the per-pair losses of any pair loss to the batch loss,
`(losses, pos, neg, labels) -> scalar`: TopK (mean of the K largest), TopK-PN (sum of the K/2 largest positive
and the K/2 largest negative ones; the paper's p is in {0, 1}, so a sum) and KL
(`gamma * log mean exp(l / gamma)`). A dro_* loss is a base pair loss plus one of them.
"""

from __future__ import annotations

from numbers import Integral
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from metricsearch.train.context import TrainContext
from metricsearch.train.losses.registry import LOSSES, register
from metricsearch.train.losses.base import PairLoss, Weighting, check_positive, masked_logsumexp


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


class TopKWeighting:
    """DRO-TopK: mean of the K largest pair losses (the mean of all pairs when there are <= K)."""

    def __init__(self, k: int = 100) -> None:
        check_k(k, 1)
        self.k = k

    def __call__(self, losses: Tensor, pos: Tensor, neg: Tensor, labels: Tensor) -> Tensor:
        total, count = masked_topk_sum(losses, pos | neg, self.k)
        return total / count.clamp(min=1)


class TopKPNWeighting:
    """DRO-TopK-PN: sum of the K/2 largest positive and the K/2 largest negative pair losses."""

    def __init__(self, k: int = 100) -> None:
        check_k(k, 2)
        self.k = k

    def __call__(self, losses: Tensor, pos: Tensor, neg: Tensor, labels: Tensor) -> Tensor:
        pos_total, _ = masked_topk_sum(losses, pos, self.k // 2)
        neg_total, _ = masked_topk_sum(losses, neg, self.k // 2)
        return pos_total + neg_total


class KLWeighting:
    """The DRO-KL loss: a base pair loss, weighted by KLWeighting (`gamma * log mean exp(l / gamma)` of its pairs)."""

    def __init__(self, gamma: float = 0.1) -> None:
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

    def pair_losses(
        self, sim: Tensor, labels: Tensor, pos: Tensor, neg: Tensor, indices: Tensor | None = None
    ) -> Tensor:
        y = pos.to(sim.dtype) * 2.0 - 1.0
        return F.relu(self.margin + y * (self.lam - sim))


def build_base(base: str | None, base_params: dict[str, Any] | None, context: TrainContext | None) -> PairLoss:
    """The base pair loss of a DRO loss: the paper's margin loss (None) or a registered pair loss, given the
    training context as any loss is."""
    params = dict(base_params or {})
    if base is None:
        return SimilarityMarginLoss(**params)
    if base not in LOSSES.names():
        raise ValueError(
            f"base must name a registered pair loss, got {base!r}; known: {LOSSES.names()}"
        )
    loss = LOSSES.build(base, context.as_dict() if context is not None else None, **params)
    if not isinstance(loss, PairLoss):
        raise ValueError(f"base must be a pair loss, {base!r} is not")
    return loss


class DROLoss(PairLoss):
    """A base pair loss whose own weighting (the mean over pairs) is replaced by a DRO weighting."""

    def __init__(
        self,
        weighting: Weighting,
        base: str | None = None,
        base_params: dict[str, Any] | None = None,
        context: TrainContext | None = None,
    ) -> None:
        super().__init__()
        self.weighting = weighting
        self.base = build_base(base, base_params, context)
        self.normalize = self.base.normalize

    def pair_losses(
        self, sim: Tensor, labels: Tensor, pos: Tensor, neg: Tensor, indices: Tensor | None = None
    ) -> Tensor:
        return self.base.pair_losses(sim, labels, pos, neg, indices)

    def weigh(
        self, losses: Tensor, pos: Tensor, neg: Tensor, labels: Tensor, indices: Tensor | None = None
    ) -> Tensor:
        """The DRO weighting of the pair losses."""
        return self.weighting(losses, pos, neg, labels)


@register("dro_topk")
class DROTopKLoss(DROLoss):
    """The DRO-TopK loss: a base pair loss, weighted by TopKWeighting (the mean of its K largest pair losses)."""

    def __init__(self, k: int = 100, base: str | None = None, base_params: dict[str, Any] | None = None,
                 context: TrainContext | None = None) -> None:
        super().__init__(TopKWeighting(k), base, base_params, context)


@register("dro_topk_pn")
class DROTopKPNLoss(DROLoss):
    """The DRO-TopK-PN loss: a base pair loss, weighted by TopKPNWeighting (its K/2 largest positive and negative)."""

    def __init__(self, k: int = 100, base: str | None = None, base_params: dict[str, Any] | None = None,
                 context: TrainContext | None = None) -> None:
        super().__init__(TopKPNWeighting(k), base, base_params, context)


@register("dro_kl")
class DROKLLoss(DROLoss):
    """The DRO-KL loss: a base pair loss, weighted by KLWeighting (`gamma * log mean exp(l / gamma)` of its pairs)."""

    def __init__(self, gamma: float = 0.1, base: str | None = None, base_params: dict[str, Any] | None = None,
                 context: TrainContext | None = None) -> None:
        super().__init__(KLWeighting(gamma), base, base_params, context)


#: the DRO weightings by name (also weightings of any pair loss, train/sampling/dro.py)
DRO_WEIGHTINGS: dict[str, type] = {"dro_topk": TopKWeighting, "dro_topk_pn": TopKPNWeighting, "dro_kl": KLWeighting}
