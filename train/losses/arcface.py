"""ArcFace (Deng et al., CVPR 2019; beyond the five papers): an additive angular margin in a normalised softmax."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from metricsearch.train.losses.proxies import NormalizedSoftmaxLoss
from metricsearch.train.losses.registry import register


@register("arcface")
class ArcFaceLoss(NormalizedSoftmaxLoss):
    """ArcFace: cross-entropy of scale x cos(theta + margin) at the own class; margin 0.5 rad (28.6 deg), scale 64.

    theta_ic is the angle of embedding i and class c's proxy; margin and scale are the paper's. Past theta =
    pi - margin, where cos(theta + margin) would rise again, the own logit is cos(theta) - margin sin(margin) (the
    released code's). `sub_centers` K > 1: K proxies per class, a class's cosine the largest of theirs (sub-centre
    ArcFace, Deng et al. 2020, uses K = 3).
    """

    def __init__(self, num_classes: int | None = None, embedding_dim: int | None = None, margin: float = 0.5,
                 scale: float = 64.0, sub_centers: int = 1, proxy_lr_factor: float = 100.0) -> None:
        super().__init__(num_classes, embedding_dim, scale, sub_centers, proxy_lr_factor)
        if not 0 <= margin < math.pi:
            raise ValueError(f"margin must be an angle in [0, pi) radians, got {margin}")
        self.margin = margin

    def target_logit(self, cos: Tensor) -> Tensor:
        # sin(theta) with a floor under its square: the gradient stays finite where an embedding meets its proxy
        sin = (1.0 - cos * cos).clamp(min=1e-12).sqrt()
        shifted = cos * math.cos(self.margin) - sin * math.sin(self.margin)
        return torch.where(cos >= -math.cos(self.margin), shifted, cos - self.margin * math.sin(self.margin))
