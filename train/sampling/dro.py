"""The DRO pair weightings (TopK, TopK-PN, KL of `train/losses/dro.py`) as weightings by name."""

from __future__ import annotations

from metricsearch.train.losses.dro import KLReduction, TopKPNReduction, TopKReduction
from metricsearch.train.sampling import register_weighting


@register_weighting("dro_topk")
def dro_topk(k: int = 100) -> TopKReduction:
    """DRO-TopK: mean of the K largest pair losses."""
    return TopKReduction(k)


@register_weighting("dro_topk_pn")
def dro_topk_pn(k: int = 100) -> TopKPNReduction:
    """DRO-TopK-PN: sum of the K/2 largest positive and the K/2 largest negative pair losses."""
    return TopKPNReduction(k)


@register_weighting("dro_kl")
def dro_kl(gamma: float = 0.1) -> KLReduction:
    """DRO-KL: gamma * log mean exp(l / gamma) over the pair losses."""
    return KLReduction(gamma)
