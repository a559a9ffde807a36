"""ProxyNCA (Movshovitz-Attias et al. 2017) as ProxyNCA++ (Teh et al. 2020) trains it; beyond the five papers."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from metricsearch.train.losses.base import check_positive
from metricsearch.train.losses.proxies import ProxyLoss
from metricsearch.train.losses.registry import register


@register("proxy_nca")
class ProxyNCALoss(ProxyLoss):
    """ProxyNCA++: -log softmax_j(-||f_i - p_j||^2 / T) at the own class's proxy, over all proxies, T = 1/9.

    As ProxyNCA++ (and pytorch-metric-learning), the own proxy is in the denominator (ProxyNCA's left it out), with
    its low temperature and fast proxies (their own, higher learning rate: `proxy_lr_factor`). Its released code
    trains with Adam at eps 1 and proxies at 1e5 x the backbone's rate; with the optimizers here the 100 x of the
    other proxy losses is the default.
    """

    def __init__(self, num_classes: int | None = None, embedding_dim: int | None = None, temperature: float = 1 / 9,
                 proxy_lr_factor: float = 100.0) -> None:
        super().__init__(num_classes, embedding_dim, 1, proxy_lr_factor)
        check_positive(temperature=temperature)
        self.temperature = temperature

    def proxy_loss(self, sim: Tensor, labels: Tensor) -> Tensor:
        # ||f - p||^2 = 2 - 2 S for unit vectors; the constant -2 / T cancels in the softmax
        return F.cross_entropy(2.0 * sim / self.temperature, labels)
