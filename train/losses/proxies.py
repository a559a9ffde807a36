"""Proxy losses (beyond the five papers): learned vectors, one or more per training class, stand in for the classes.

The proxies are a parameter of the loss, `num_classes x proxies_per_class` rows of `embedding_dim` (training passes
both numbers); the optimizer gives them their own learning rate (`param_groups`), checkpoints keep them in the
loss's state, and export never sees them (it takes the embedder alone). Every loss here compares L2-normalised
embeddings with L2-normalised proxies: `S_ij` below is the cosine of embedding i and proxy j.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metricsearch.train.losses.base import MetricLoss, Mined, check_inputs, check_positive, zero_loss
from metricsearch.train.weightings.base import Weighting


def check_count(**counts: int | None) -> None:
    """Raise a ValueError naming the first count that is not an integer >= 1."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def check_margin(margin: float) -> None:
    """Raise a ValueError unless `margin` is a finite number >= 0."""
    if not (isinstance(margin, (int, float)) and 0 <= margin < float("inf")):
        raise ValueError(f"margin must be a number >= 0, got {margin!r}")


class ProxyLoss(MetricLoss):
    """Base of the proxy losses: `loss(embeddings, labels)` with labels in [0, num_classes); no miner, no weighting.

    The proxies start as random unit vectors (each loss reads only their directions); `proxy_lr_factor` sets their
    learning rate to that many times the backbone's (optimizer.lr): 100, as Proxy-Anchor's and SoftTriple's code.
    """

    mines: ClassVar[str] = "none"

    def __init__(self, num_classes: int | None, embedding_dim: int | None, proxies_per_class: int = 1,
                 proxy_lr_factor: float = 100.0) -> None:
        super().__init__()
        if num_classes is None or embedding_dim is None:
            raise ValueError("num_classes and embedding_dim are required: training passes them (in Python, give "
                             f"both), got num_classes={num_classes}, embedding_dim={embedding_dim}")
        check_count(num_classes=num_classes, embedding_dim=embedding_dim)
        check_positive(proxy_lr_factor=proxy_lr_factor)
        self.num_classes, self.per_class, self.proxy_lr_factor = num_classes, proxies_per_class, proxy_lr_factor
        self.proxies = nn.Parameter(F.normalize(torch.randn(num_classes * proxies_per_class, embedding_dim), dim=1))

    def proxy_similarity(self, embeddings: Tensor) -> Tensor:
        """B x (num_classes x proxies_per_class) cosines of the embeddings and the proxies, a class's proxies side by
        side; in float32 (float64 inputs stay float64) with autocast off, as `similarity`."""
        with torch.autocast(embeddings.device.type, enabled=False):
            rows = self._prepare(embeddings)
            return rows @ F.normalize(self.proxies.to(rows.dtype), dim=1).t()

    def proxy_labels(self) -> Tensor:
        """The class of every proxy."""
        return torch.arange(len(self.proxies), device=self.proxies.device) // self.per_class

    def proxy_loss(self, sim: Tensor, labels: Tensor) -> Tensor:
        """The batch loss from the similarities to the proxies (`proxy_similarity`); each loss implements it."""
        raise NotImplementedError

    def check_batch(self, embeddings: Tensor, labels: Tensor) -> None:
        """Raise a ValueError when the embeddings do not have the proxies' dimension or a label has no proxy."""
        check_inputs(embeddings, labels)
        if embeddings.shape[1] != self.proxies.shape[1]:
            raise ValueError(f"embeddings have {embeddings.shape[1]} dimensions but the proxies "
                             f"{self.proxies.shape[1]} (embedding_dim)")
        if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise ValueError(f"labels must lie in [0, num_classes={self.num_classes}), got "
                             f"{int(labels.min())}..{int(labels.max())}")

    def forward(
        self, embeddings: Tensor, labels: Tensor, mined: Mined | None = None, weighting: Weighting | None = None,
        indices: Tensor | None = None,
    ) -> Tensor:
        """The batch loss, a scalar tensor (mined pairs and indices are not used)."""
        self.check_batch(embeddings, labels)
        self.check_weighting(weighting)
        with torch.autocast(embeddings.device.type, enabled=False):  # regularisers of the proxies in float32 too
            return self.proxy_loss(self.proxy_similarity(embeddings), labels) + zero_loss(embeddings)

    def pair_weights(
        self, embeddings: Tensor, labels: Tensor, mined: Mined | None = None, indices: Tensor | None = None
    ) -> Tensor:
        """B x (num_classes x proxies_per_class) |dL/dS_ij| over the (embedding, proxy) pairs, by autograd."""
        self.check_batch(embeddings, labels)
        with torch.enable_grad():
            sim = self.proxy_similarity(embeddings.detach()).detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(self.proxy_loss(sim, labels), sim, allow_unused=True)
        return torch.zeros_like(sim) if grad is None else grad.abs()

    def weighted_pairs(self, embeddings: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The (embedding, proxy) pairs: similarities, pair weights, and the masks of own-class and other proxies."""
        with torch.no_grad():
            sim = self.proxy_similarity(embeddings.detach())
        own = labels[:, None] == self.proxy_labels()[None, :]
        return sim, self.pair_weights(embeddings, labels), own, ~own

    def param_groups(self, base_lr: float) -> list[dict[str, Any]]:
        """Optimiser groups for the loss's own parameters: the proxies at `proxy_lr_factor` x `base_lr`."""
        return [{"params": list(self.parameters()), "lr": base_lr * self.proxy_lr_factor}]


class NormalizedSoftmaxLoss(ProxyLoss):
    """Base of the normalised-softmax family: cross-entropy of `scale x` the cosines to the class weights (proxies),
    the own class's cosine changed by `target_logit`; with `sub_centers` K > 1 (Deng et al. 2020) a class's cosine
    is the largest of its K proxies'."""

    def __init__(self, num_classes: int | None, embedding_dim: int | None, scale: float, sub_centers: int = 1,
                 proxy_lr_factor: float = 100.0) -> None:
        check_count(sub_centers=sub_centers)
        super().__init__(num_classes, embedding_dim, sub_centers, proxy_lr_factor)
        check_positive(scale=scale)
        self.scale = scale

    def target_logit(self, cos: Tensor) -> Tensor:
        """The own class's logit (before the scale) from its cosine: the cosine itself, or one with a margin."""
        return cos

    def proxy_loss(self, sim: Tensor, labels: Tensor) -> Tensor:
        cos = sim.unflatten(1, (self.num_classes, self.per_class)).amax(dim=2)
        own = cos.gather(1, labels[:, None])
        logits = cos + F.one_hot(labels, self.num_classes).to(cos.dtype) * (self.target_logit(own) - own)
        return F.cross_entropy(self.scale * logits, labels)
