"""Multi-class N-pair loss (Sohn 2016) on dot products of un-normalised embeddings, with an L2 penalty."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from metricsearch.train.losses.registry import register
from metricsearch.train.losses.base import MetricLoss, Mined, zero_loss


def first_two_per_class(labels: Tensor) -> tuple[Tensor, Tensor]:
    """Indices of the first and second image (in batch order) of every class that has two or more."""
    sorted_labels, order = torch.sort(labels, stable=True)
    same_as_next = sorted_labels[1:] == sorted_labels[:-1]
    # sorted position i starts its class (position 0 does); it has a second image iff same_as_next[i]
    starts = torch.cat([same_as_next.new_ones(1), ~same_as_next])[:-1]
    first = (starts & same_as_next).nonzero().squeeze(1)
    return order[first], order[first + 1]


def npair_loss(logits: Tensor) -> Tensor:
    """Mean over anchors i of `-log softmax(logits[i])[i]`: logits[i, k] = S(anchor i, positive k)."""
    return F.cross_entropy(logits, torch.arange(logits.shape[0], device=logits.device))


@register("npair")
class NPairLoss(MetricLoss):
    """Multi-class N-pair loss: per class, softmax of its anchor against the positives of all classes.

    The first image of each class in the batch is its anchor, the second its positive; further
    images are not used (the paper's batch is n classes x 2). The loss is the mean over anchors of
    `-log exp(S_ap) / sum_k exp(S_a,p_k)` with S the dot product, plus `l2_reg * mean_i ||f_i||^2`
    over the whole batch (Sohn's regulariser; 0 disables it and matches pytorch-metric-learning).

    Only the n x n anchor-positive block of S is used, so `block` names it and the loss is computed
    from that block alone (n^2 dot products instead of B^2), in `forward` and `pair_weights` alike.
    """

    mines: ClassVar[str] = "none"
    normalize = False

    def __init__(self, l2_reg: float = 0.002) -> None:
        super().__init__()
        if l2_reg < 0:
            raise ValueError(f"l2_reg must be >= 0, got {l2_reg}")
        self.l2_reg = l2_reg

    def block(self, labels: Tensor) -> tuple[Tensor, Tensor]:
        """The anchors (rows) and positives (columns): the first two images of each class."""
        return first_two_per_class(labels)

    def loss_from_similarity(self, sim: Tensor, labels: Tensor, mined: Mined | None = None) -> Tensor:
        """The N-pair loss from the anchor-positive block of S (0, with graph, when it is empty)."""
        return npair_loss(sim) if sim.numel() > 0 else zero_loss(sim)

    def extra_loss(self, embeddings: Tensor) -> Tensor | None:
        """The L2 penalty `l2_reg * mean ||f||^2` (None when l2_reg is 0)."""
        if self.l2_reg == 0:
            return None
        emb = embeddings if embeddings.dtype == torch.float64 else embeddings.float()
        return emb.square().sum() * (self.l2_reg / max(emb.shape[0], 1))
