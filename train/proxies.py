"""Class proxies: one learned unit vector per training class, as extra references of a pair loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metricsearch.train.losses.base import MetricLoss, Mined, Weighting
from metricsearch.train.memory import supports_memory


class ClassProxies(nn.Module):
    """A loss whose anchors (the batch) are compared with the batch and with one learned proxy per class.

    Each proxy is a positive of its class's images and (with `negatives`) a negative of every other image,
    so each step sees every class, not only the batch's; the proxies train with the network and are left
    out of the exported model.
    """

    def __init__(self, loss: MetricLoss, labels: list[int], dim: int, negatives: bool = True) -> None:
        super().__init__()
        if not supports_memory(loss):
            raise ValueError(f"loss {type(loss).__name__} cannot compare with class proxies; "
                             "use loss ms, or set proxies.per_class: 0")
        if not labels:
            raise ValueError("class proxies need at least one training class")
        self.loss, self.negatives = loss, negatives
        self.register_buffer("proxy_labels", torch.tensor(sorted(set(labels)), dtype=torch.long))
        self.proxies = nn.Parameter(F.normalize(torch.randn(len(self.proxy_labels), dim), dim=1))

    def forward(self, embeddings: Tensor, labels: Tensor, mined: Mined | None = None,
                weighting: Weighting | None = None, indices: Tensor | None = None) -> Tensor:
        """The batch loss against the batch and the L2-normalised proxies."""
        return self.loss.loss_against(embeddings, labels, F.normalize(self.proxies, dim=1), self.proxy_labels,
                                      ref_negatives=self.negatives)
