"""Importance weights W = P_uniform / Q_design (weighted-contrastive paper, eqs. 8, 9, 24, 25).

Q(i, j) is the probability of the ordered pair (i, j) per pair slot of a batch: the probability
that the batch holds (i, j), divided by the design's number of ordered pair slots `slots`. Each
sampler describes its own design (`LabelBatchSampler.design`: eq. 9 for the (m, n)-group design,
eq. 8 for p-random). The mini-batch loss `1/slots * sum_k W_k l_k` then has the
full-data loss `1/(N(N-1)) sum_{i != j} l_ij` as its expectation (eq. 10 scaled).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from metricsearch.train.weightings.registry import register_weighting

if TYPE_CHECKING:  # a type only: samplers import the losses, whose DRO losses import the weightings
    from metricsearch.train.samplers.base import LabelBatchSampler


def counts_table(
    class_counts: Mapping[int, int] | Sequence[int] | np.ndarray | Tensor,
) -> tuple[np.ndarray, np.ndarray]:
    """(class ids, image counts) from a {class: count} mapping or counts indexed by class id."""
    if isinstance(class_counts, Mapping):
        classes = np.array(sorted(class_counts), dtype=np.int64)
        counts = np.array([class_counts[c] for c in classes], dtype=np.int64)
    else:
        counts = np.asarray(class_counts, dtype=np.int64)
        classes = np.arange(len(counts))
    present = counts > 0
    return classes[present], counts[present]


@register_weighting("importance")
class ImportanceWeighting:
    """Weighting `1/slots * sum_k W_k^delta l_k` with W = P_uniform / Q of the sampler's design.

    The sampler must describe its design (`design` is not None). `class_counts` (training images per class,
    a mapping or a sequence indexed by class id) defaults to the sampler's own labels and must agree with
    them when both are given.
    """

    def __init__(
        self, sampler: LabelBatchSampler,
        class_counts: Mapping[int, int] | Sequence[int] | np.ndarray | Tensor | None = None,
        delta: float = 1.0,
    ) -> None:
        own_classes, own_counts = np.unique(sampler.labels, return_counts=True)
        classes, counts = (own_classes, own_counts) if class_counts is None else counts_table(class_counts)
        if not (np.array_equal(classes, own_classes) and np.array_equal(counts, own_counts)):
            raise ValueError("class_counts do not match the class counts of the sampler's labels")
        design = sampler.design(counts)
        if design is None:
            raise ValueError(
                f"importance weighting needs the pair probabilities of the sampler's batch design, and "
                f"{type(sampler).__name__} describes none; use a sampler that does (group, p_random) "
                "or drop the weighting"
            )
        total = counts.sum()
        drawn = design.q > 0  # pairs the design never draws (Q = 0) get weight 0, not inf
        weights = np.where(drawn, 1.0 / (total * (total - 1) * np.where(drawn, design.q, 1.0)), 0.0)
        self.sampler = sampler
        self.classes = torch.as_tensor(classes)
        self.weights = torch.as_tensor(weights ** delta, dtype=torch.float32)
        self.slots, self.delta = design.slots, delta

    def importance_weights(self, labels: Tensor) -> Tensor:
        """B x B importance weights (W^delta) of the batch's ordered pairs."""
        classes = self.classes.to(labels.device)
        rows = torch.searchsorted(classes, labels).clamp(max=len(classes) - 1)
        if (classes[rows] != labels).any():
            raise ValueError("labels contain a class missing from the training class counts")
        weights = self.weights.to(labels.device)
        return weights[rows[:, None], rows[None, :]]

    def __call__(self, losses: Tensor, pos: Tensor, neg: Tensor, labels: Tensor) -> Tensor:
        weighted = self.importance_weights(labels).to(losses.dtype) * losses
        return torch.where(pos | neg, weighted, torch.zeros_like(losses)).sum() / self.slots

