"""Contrastive losses: plain (Hadsell et al. 2006), weighted and balanced (weighted-contrastive paper).

All are pair losses averaged over the pairs of the batch, so importance weights and DRO weightings
replace the mean. Distances come from cosine similarities of unit vectors: D^2 = 2 - 2S.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from metricsearch.train.losses.registry import register
from metricsearch.train.losses.base import PairLoss, check_positive, distances_from_similarity

FORMS = ("distance", "similarity")


def contrastive_terms(sim: Tensor, margin: float) -> tuple[Tensor, Tensor]:
    """The positive term g = D^2 and the negative term h = [margin - D]_+^2, from S (eq. 5)."""
    g = (2.0 - 2.0 * sim).clamp(min=0.0)
    h = F.relu(margin - distances_from_similarity(sim)).square()
    return g, h


@register("contrastive")
class ContrastiveLoss(PairLoss):
    """Contrastive loss, `Y D^2 + (1-Y)[a - D]_+^2` or, with form="similarity", `(1-Y)[S - l]_+ - Y S`."""

    def __init__(
        self, margin: float = 1.0, form: str = "distance", sim_margin: float = 0.5
    ) -> None:
        super().__init__()
        check_positive(margin=margin)
        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {form!r}")
        self.margin, self.form, self.sim_margin = margin, form, sim_margin

    def pair_losses(
        self, sim: Tensor, labels: Tensor, pos: Tensor, neg: Tensor, indices: Tensor | None = None
    ) -> Tensor:
        if self.form == "similarity":
            return torch.where(pos, -sim, F.relu(sim - self.sim_margin))
        g, h = contrastive_terms(sim, self.margin)
        return torch.where(pos, g, h)


@register("weighted_contrastive")
class WeightedContrastiveLoss(PairLoss):
    """Weighted contrastive loss `Y g(D) + (1-Y) eta h(D)` (eq. 10); eta = 1 is the contrastive loss."""

    def __init__(self, margin: float = 1.0, eta: float = 1.0) -> None:
        super().__init__()
        check_positive(margin=margin, eta=eta)
        self.margin, self.eta = margin, eta

    def negative_weights(self, labels: Tensor) -> Tensor | float:
        """eta_ij, the weight of the negative pair (i, j): a scalar or a B x B matrix."""
        return self.eta

    def pair_losses(
        self, sim: Tensor, labels: Tensor, pos: Tensor, neg: Tensor, indices: Tensor | None = None
    ) -> Tensor:
        g, h = contrastive_terms(sim, self.margin)
        eta = torch.as_tensor(self.negative_weights(labels), dtype=h.dtype, device=h.device)
        return torch.where(pos, g, eta * h)


@register("balanced_contrastive")
class BalancedContrastiveLoss(WeightedContrastiveLoss):
    """Balanced contrastive loss: weighted contrastive with eta_ij = lam/(L-1) (N_{y_i}-1)/N_{y_j} (eq. 16).

    `class_counts` maps each training label to its number of training images (N_c) and
    `num_classes` is L (the number of entries of `class_counts` when None). With every class of
    the same size N, lam = N (L-1) / (N-1) (eq. 17) gives eta = 1, the plain contrastive loss.
    """

    def __init__(
        self,
        class_counts: dict[int, int] | None = None,
        num_classes: int | None = None,
        lam: float = 256.0,
        margin: float = 1.0,
    ) -> None:
        super().__init__(margin=margin)
        if not class_counts:
            raise ValueError(
                "class_counts is required for balanced_contrastive: a dict label -> number of "
                "training images of that label (the trainer passes it)"
            )
        if min(class_counts.values()) < 1:
            raise ValueError("class_counts must hold counts >= 1")
        num_classes = len(class_counts) if num_classes is None else num_classes
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        check_positive(lam=lam)
        self.lam, self.num_classes = lam, num_classes
        keys = sorted(class_counts)
        self.register_buffer("count_labels", torch.tensor(keys, dtype=torch.long), persistent=False)
        self.register_buffer(
            "counts", torch.tensor([class_counts[k] for k in keys], dtype=torch.float64),
            persistent=False,
        )

    def negative_weights(self, labels: Tensor) -> Tensor:
        """eta_ij = lam/(L-1) (N_{y_i}-1)/N_{y_j} for the batch labels (B x B)."""
        labels = labels.to(self.count_labels.dtype)
        idx = torch.searchsorted(self.count_labels, labels).clamp(max=len(self.count_labels) - 1)
        if not torch.equal(self.count_labels[idx], labels):
            raise ValueError("labels contain a class missing from class_counts")
        n = self.counts[idx]
        return self.lam / (self.num_classes - 1) * (n[:, None] - 1) / n[None, :]
