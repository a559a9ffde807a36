"""Proxy-Anchor loss (Kim et al., CVPR 2020; beyond the five papers): every proxy is an anchor against the batch."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from metricsearch.train.losses.base import check_positive, masked_logsumexp
from metricsearch.train.losses.proxies import ProxyLoss, check_margin
from metricsearch.train.losses.registry import register


@register("proxy_anchor")
class ProxyAnchorLoss(ProxyLoss):
    """Proxy-Anchor: each proxy pulls its class's embeddings, pushes the others' (log-sum-exp); alpha 32, margin 0.1.

    The loss is 1/|P+| sum_{p in P+} log(1 + sum_{i in X_p+} e^{-alpha (S_ip - margin)})
    + 1/|P| sum_{p in P} log(1 + sum_{i in X_p-} e^{alpha (S_ip + margin)}): P holds the num_classes proxies, P+
    those of the classes in the batch, X_p+ and X_p- the batch's embeddings of p's class and of the others (the
    paper's eq. 4); alpha = 32 and margin (delta) = 0.1 are the paper's.
    """

    def __init__(self, num_classes: int | None = None, embedding_dim: int | None = None, alpha: float = 32.0,
                 margin: float = 0.1, proxy_lr_factor: float = 100.0) -> None:
        super().__init__(num_classes, embedding_dim, 1, proxy_lr_factor)
        check_positive(alpha=alpha)
        check_margin(margin)
        self.alpha, self.margin = alpha, margin

    def proxy_loss(self, sim: Tensor, labels: Tensor) -> Tensor:
        own = F.one_hot(labels, self.num_classes).bool()
        # log(1 + sum e^x) = softplus(log sum e^x): 0 for a proxy with no such embedding in the batch
        pulled = F.softplus(masked_logsumexp(-self.alpha * (sim - self.margin), own, dim=0))
        pushed = F.softplus(masked_logsumexp(self.alpha * (sim + self.margin), ~own, dim=0))
        return pulled.sum() / own.any(dim=0).sum().clamp(min=1) + pushed.sum() / self.num_classes
