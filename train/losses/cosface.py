"""CosFace (Wang et al., CVPR 2018; beyond the five papers): an additive cosine margin in a normalised softmax."""

from __future__ import annotations

from torch import Tensor

from metricsearch.train.losses.proxies import NormalizedSoftmaxLoss, check_margin
from metricsearch.train.losses.registry import register


@register("cosface")
class CosFaceLoss(NormalizedSoftmaxLoss):
    """CosFace: cross-entropy of scale x (S_ic - margin at the own class); margin 0.35, scale 64 (the paper's).

    `sub_centers` K > 1: K proxies per class, a class's cosine the largest of theirs (Deng et al. 2020 use K = 3).
    """

    def __init__(self, num_classes: int | None = None, embedding_dim: int | None = None, margin: float = 0.35,
                 scale: float = 64.0, sub_centers: int = 1, proxy_lr_factor: float = 100.0) -> None:
        super().__init__(num_classes, embedding_dim, scale, sub_centers, proxy_lr_factor)
        check_margin(margin)
        self.margin = margin

    def target_logit(self, cos: Tensor) -> Tensor:
        return cos - self.margin
