"""NormSoftmax (Zhai & Wu, "Classification is a strong baseline for deep metric learning", 2018; beyond the five
papers): a softmax classifier on the cosines to normalised class weights, at a low temperature."""

from __future__ import annotations

from metricsearch.train.losses.base import check_positive
from metricsearch.train.losses.proxies import NormalizedSoftmaxLoss
from metricsearch.train.losses.registry import register


@register("normsoftmax")
class NormSoftmaxLoss(NormalizedSoftmaxLoss):
    """NormSoftmax: cross-entropy of S_ic / temperature, one normalised weight (proxy) per class; temperature 0.05."""

    def __init__(self, num_classes: int | None = None, embedding_dim: int | None = None, temperature: float = 0.05,
                 proxy_lr_factor: float = 100.0) -> None:
        check_positive(temperature=temperature)
        super().__init__(num_classes, embedding_dim, 1.0 / temperature, 1, proxy_lr_factor)
        self.temperature = temperature
