"""SoftTriple loss (Qian et al., ICCV 2019; beyond the five papers): several centres (proxies) per class."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from metricsearch.train.losses.base import check_positive
from metricsearch.train.losses.proxies import ProxyLoss, check_count, check_margin
from metricsearch.train.losses.registry import register


@register("soft_triple")
class SoftTripleLoss(ProxyLoss):
    """SoftTriple: cross-entropy of la x (S'_ic - margin at the own class), plus reg_weight x the centres' spread.

    S'_ic = sum_k softmax_k(S_ick / gamma) S_ick relaxes the largest of class c's K = centers_per_class centres; the
    regulariser, sum over each class's pairs of centres of sqrt(2 + 1e-5 - 2 <w_ck, w_cl>) over C K (K - 1), lets
    centres merge (1e-5 as the released code). K = 10, la = 20, gamma = 0.1, reg_weight (tau) = 0.2 and
    margin (delta) = 0.01 are the paper's.
    """

    def __init__(self, num_classes: int | None = None, embedding_dim: int | None = None, centers_per_class: int = 10,
                 la: float = 20.0, gamma: float = 0.1, reg_weight: float = 0.2, margin: float = 0.01,
                 proxy_lr_factor: float = 100.0) -> None:
        check_count(centers_per_class=centers_per_class)
        super().__init__(num_classes, embedding_dim, centers_per_class, proxy_lr_factor)
        check_positive(la=la, gamma=gamma)
        check_margin(margin)
        if reg_weight < 0:
            raise ValueError(f"reg_weight must be >= 0, got {reg_weight}")
        self.la, self.gamma, self.reg_weight, self.margin = la, gamma, reg_weight, margin

    def proxy_loss(self, sim: Tensor, labels: Tensor) -> Tensor:
        centres = sim.unflatten(1, (self.num_classes, self.per_class))
        relaxed = (torch.softmax(centres / self.gamma, dim=2) * centres).sum(dim=2)
        own = F.one_hot(labels, self.num_classes).to(sim.dtype)
        return F.cross_entropy(self.la * (relaxed - self.margin * own), labels) + self.reg_weight * self.spread()

    def spread(self) -> Tensor:
        """The regulariser: the mean over ordered pairs of a class's centres of sqrt(2 + 1e-5 - 2 cos), halved."""
        k = self.per_class
        if k == 1:
            return self.proxies.sum() * 0.0
        centres = F.normalize(self.proxies, dim=1).unflatten(0, (self.num_classes, k))
        upper = torch.ones(k, k, dtype=torch.bool, device=centres.device).triu(diagonal=1)
        cos = (centres @ centres.transpose(1, 2))[:, upper]
        return torch.sqrt(2.0 + 1e-5 - 2.0 * cos).sum() / (self.num_classes * k * (k - 1))
