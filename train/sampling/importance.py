"""Importance weights W = P_uniform / Q_design (weighted-contrastive paper, eqs. 8, 9, 24, 25).

Q(i, j) is the probability of the ordered pair (i, j) per pair slot of a batch: the probability
that the batch holds (i, j), divided by the design's number of ordered pair slots `slots`
(m n (m n - 1) for the (m, n)-group design; B = 2 x pairs for p-random, whose masks hold each
drawn pair in both directions). The mini-batch loss `1/slots * sum_k W_k l_k` then has the
full-data loss `1/(N(N-1)) sum_{i != j} l_ij` as its expectation (eq. 10 scaled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from metricsearch.train.sampling import register_weighting
from metricsearch.train.sampling.base import LabelBatchSampler
from metricsearch.train.sampling.group import GroupSampler
from metricsearch.train.sampling.p_random import PRandomSampler


def q_group(counts: np.ndarray, m: int, n: int) -> np.ndarray:
    """C x C: Q of one ordered pair with classes (c, d) under the (m, n)-group design (eq. 9).

    Generalised to the group sampler's rules: classes with one image are never drawn (L counts
    the others) and a class with N_c < m contributes all m_c = N_c of its images; with every
    N_c >= m this is exactly eq. 9.
    """
    counts = np.asarray(counts, dtype=np.float64)
    drawn = counts >= 2
    big_l = drawn.sum()
    m_c = np.where(drawn, np.minimum(m, counts), 0.0)
    slots = m * n * (m * n - 1)
    pos = n / big_l * m_c * (m_c - 1) / np.maximum(counts * (counts - 1), 1)
    neg = n * (n - 1) / (big_l * (big_l - 1)) * np.outer(m_c / counts, m_c / counts)
    return np.where(np.eye(len(counts), dtype=bool), np.diag(pos), neg) / slots


def q_p_random(counts: np.ndarray, p: float) -> np.ndarray:
    """C x C: Q of one ordered pair with classes (c, d) under the p-random design (eq. 8).

    Positive pairs are drawn from the classes with >= 2 images (L+ of them), negative pairs from
    all L classes; with no single-image class L+ = L and this is exactly eq. 8.
    """
    counts = np.asarray(counts, dtype=np.float64)
    multi = counts >= 2
    big_l = len(counts)
    pos = np.where(multi, p / (multi.sum() * np.maximum(counts * (counts - 1), 1)), 0.0)
    neg = (1 - p) / (big_l * (big_l - 1) * np.outer(counts, counts))
    return np.where(np.eye(big_l, dtype=bool), np.diag(pos), neg)


@dataclass(frozen=True)
class Design:
    """A batch design's pair probabilities Q (C x C over class pairs) and its pair slots per batch."""

    q: np.ndarray
    slots: int


def design_of(sampler: LabelBatchSampler, counts: np.ndarray) -> Design:
    """The batch design of `sampler` over classes with `counts`; ValueError for one it cannot weight."""
    if isinstance(sampler, GroupSampler):
        return Design(q_group(counts, sampler.m, sampler.n), sampler.m * sampler.n * (sampler.m * sampler.n - 1))
    if isinstance(sampler, PRandomSampler):
        return Design(q_p_random(counts, sampler.p), sampler.batch_size)
    raise ValueError(
        f"importance weighting knows the pair probabilities of the 'group' and 'p_random' samplers "
        f"only, not of {type(sampler).__name__}; use one of them or drop the weighting"
    )


def counts_table(class_counts: Mapping[int, int] | Sequence[int] | np.ndarray | Tensor) -> tuple[np.ndarray, np.ndarray]:
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
    """Reduction `1/slots * sum_k W_k^delta l_k` with W = P_uniform / Q of the sampler's design.

    `class_counts` (training images per class, a mapping or a sequence indexed by class id)
    defaults to the sampler's own labels and must agree with them when both are given.
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
        design = design_of(sampler, counts)
        total = counts.sum()
        drawn = design.q > 0  # pairs the design never draws (Q = 0) get weight 0, not inf
        weights = np.where(drawn, 1.0 / (total * (total - 1) * np.where(drawn, design.q, 1.0)), 0.0)
        self.sampler = sampler
        self.classes = torch.as_tensor(classes)
        self.weights = torch.as_tensor(weights ** delta, dtype=torch.float32)
        self.slots, self.delta = design.slots, delta

    def pair_weights(self, labels: Tensor) -> Tensor:
        """B x B importance weights (W^delta) of the batch's ordered pairs."""
        classes = self.classes.to(labels.device)
        rows = torch.searchsorted(classes, labels).clamp(max=len(classes) - 1)
        if (classes[rows] != labels).any():
            raise ValueError("labels contain a class missing from the training class counts")
        weights = self.weights.to(labels.device)
        return weights[rows[:, None], rows[None, :]]

    def __call__(self, losses: Tensor, pos: Tensor, neg: Tensor, labels: Tensor) -> Tensor:
        weighted = self.pair_weights(labels).to(losses.dtype) * losses
        return torch.where(pos | neg, weighted, torch.zeros_like(losses)).sum() / self.slots

