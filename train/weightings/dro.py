"""Distributionally robust weightings (Qi et al., DRO framework) of any pair loss's per-pair losses.

TopK (mean of the K largest), TopK-PN (sum of the K/2 largest positive and the K/2 largest negative ones; the paper's
p is in {0, 1}, so a sum) and KL (`gamma * log mean exp(l / gamma)`); the dro_* losses (train/losses/dro.py) are a
base pair loss plus one of them.
"""

from __future__ import annotations

from numbers import Integral

import torch
from torch import Tensor

from metricsearch.train.losses.base import check_positive, masked_logsumexp
from metricsearch.train.weightings.registry import register_weighting


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


@register_weighting("dro_topk")
class TopKWeighting:
    """DRO-TopK: mean of the K largest pair losses (the mean of all pairs when there are <= K)."""

    def __init__(self, k: int = 100) -> None:
        check_k(k, 1)
        self.k = k

    def __call__(self, losses: Tensor, pos: Tensor, neg: Tensor, labels: Tensor) -> Tensor:
        total, count = masked_topk_sum(losses, pos | neg, self.k)
        return total / count.clamp(min=1)


@register_weighting("dro_topk_pn")
class TopKPNWeighting:
    """DRO-TopK-PN: sum of the K/2 largest positive and the K/2 largest negative pair losses."""

    def __init__(self, k: int = 100) -> None:
        check_k(k, 2)
        self.k = k

    def __call__(self, losses: Tensor, pos: Tensor, neg: Tensor, labels: Tensor) -> Tensor:
        pos_total, _ = masked_topk_sum(losses, pos, self.k // 2)
        neg_total, _ = masked_topk_sum(losses, neg, self.k // 2)
        return pos_total + neg_total


@register_weighting("dro_kl")
class KLWeighting:
    """DRO-KL: `gamma * log mean exp(l / gamma)` of the pair losses, a soft maximum (the mean as gamma grows)."""

    def __init__(self, gamma: float = 0.1) -> None:
        check_positive(gamma=gamma)
        self.gamma = gamma

    def __call__(self, losses: Tensor, pos: Tensor, neg: Tensor, labels: Tensor) -> Tensor:
        mask = (pos | neg).flatten()
        count = mask.sum()
        lse = masked_logsumexp(losses.flatten() / self.gamma, mask, dim=0)
        value = self.gamma * (lse - torch.log(count.clamp(min=1).to(losses.dtype)))
        return torch.where(count > 0, value, torch.zeros_like(value))
