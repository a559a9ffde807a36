"""Multi-class N-pair loss (Sohn 2016) on dot products of un-normalised embeddings, with an L2 penalty."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from metricsearch.train.losses import register
from metricsearch.train.losses.base import MetricLoss, Mined, Reduction, zero_loss


def first_two_per_class(labels: Tensor) -> tuple[Tensor, Tensor]:
    """Indices of the first and second image (in batch order) of every class that has two or more."""
    sorted_labels, order = torch.sort(labels, stable=True)
    position = torch.arange(labels.shape[0], device=labels.device)
    starts = torch.ones_like(sorted_labels, dtype=torch.bool)
    starts[1:] = sorted_labels[1:] != sorted_labels[:-1]
    group_start = torch.where(starts, position, torch.zeros_like(position)).cummax(dim=0).values
    second = (position - group_start == 1).nonzero().squeeze(1)
    return order[second - 1], order[second]


@register("npair")
class NPairLoss(MetricLoss):
    """Multi-class N-pair loss: per class, softmax of its anchor against the positives of all classes.

    The first image of each class in the batch is its anchor, the second its positive; further
    images are not used (the paper's batch is n classes x 2). The loss is the mean over anchors of
    `-log exp(S_ap) / sum_k exp(S_a,p_k)` with S the dot product, plus `l2_reg * mean_i ||f_i||^2`
    over the whole batch (Sohn's regulariser; 0 disables it and matches pytorch-metric-learning).
    """

    mines: ClassVar[str] = "none"
    normalize = False

    def __init__(self, l2_reg: float = 0.002) -> None:
        super().__init__()
        if l2_reg < 0:
            raise ValueError(f"l2_reg must be >= 0, got {l2_reg}")
        self.l2_reg = l2_reg

    def loss_from_similarity(
        self, sim: Tensor, labels: Tensor, mined: Mined | None, reduction: Reduction | None
    ) -> Tensor:
        anchors, positives = first_two_per_class(labels)
        if anchors.numel() == 0:
            return zero_loss(sim)
        logits = sim[anchors][:, positives]
        return F.cross_entropy(logits, torch.arange(anchors.numel(), device=sim.device))

    def extra_loss(self, embeddings: Tensor) -> Tensor | None:
        """The L2 penalty `l2_reg * mean ||f||^2` (None when l2_reg is 0)."""
        if self.l2_reg == 0:
            return None
        emb = embeddings if embeddings.dtype == torch.float64 else embeddings.float()
        return self.l2_reg * emb.square().sum(dim=1).mean()
