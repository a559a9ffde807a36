"""The p-random batch design (weighted-contrastive paper, section 4.1): a batch is a list of pairs."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from metricsearch.train.losses.base import Mined
from metricsearch.train.samplers.registry import register_sampler
from metricsearch.train.samplers.base import Design, LabelBatchSampler


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


@register_sampler("p_random")
class PRandomSampler(LabelBatchSampler):
    """`pairs_per_batch` pairs laid out [a1, b1, a2, b2, ...]; each is positive with probability p.

    Positive pair: a class uniformly among those with >= 2 images, then two distinct images of it.
    Negative pair: an ordered pair of distinct classes uniformly among all classes, one image each.
    """

    fixes_pairs: ClassVar[bool] = True

    def __init__(
        self, labels: np.ndarray, p: float = 0.5, pairs_per_batch: int = 32, seed: int = 0,
        rank: int = 0, world_size: int = 1, batches_per_epoch: int | None = None,
    ) -> None:
        super().__init__(labels, seed, rank, world_size, batches_per_epoch)
        if not 0 <= p <= 1:
            raise ValueError(f"p must be in [0, 1], got {p}")
        if pairs_per_batch < 1:
            raise ValueError(f"pairs_per_batch must be >= 1, got {pairs_per_batch}")
        order = np.argsort(self.labels, kind="stable")
        _, starts, counts = np.unique(self.labels[order], return_index=True, return_counts=True)
        if len(counts) < 2 or not (counts >= 2).any():
            raise ValueError("p_random needs two classes or more, one of them with two images or more")
        self.order, self.starts, self.counts = order, starts, counts
        self.multi = np.flatnonzero(counts >= 2)  # classes positive pairs are drawn from
        self.p, self.pairs_per_batch = p, pairs_per_batch

    @property
    def batch_size(self) -> int:
        return 2 * self.pairs_per_batch

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        k = self.pairs_per_batch
        positive = rng.random(k) < self.p
        # positive pairs: class c, image i, then image j != i (skip i in a range of N_c - 1)
        c_pos = self.multi[rng.integers(len(self.multi), size=k)]
        i_pos = rng.integers(self.counts[c_pos])
        j_pos = rng.integers(self.counts[c_pos] - 1)
        j_pos += j_pos >= i_pos
        # negative pairs: class c, class d != c (skip c in a range of L - 1), one image each
        c_neg = rng.integers(len(self.counts), size=k)
        d_neg = rng.integers(len(self.counts) - 1, size=k)
        d_neg += d_neg >= c_neg
        first = np.where(positive, self.starts[c_pos] + i_pos, self.starts[c_neg] + rng.integers(self.counts[c_neg]))
        second = np.where(positive, self.starts[c_pos] + j_pos, self.starts[d_neg] + rng.integers(self.counts[d_neg]))
        return self.order[np.stack([first, second], axis=1).reshape(-1)]

    def design(self, counts: np.ndarray) -> Design:
        """Eq. 8's Q over the designated pairs, each held in both directions: B = 2 x pairs slots."""
        return Design(q_p_random(counts, self.p), self.batch_size)

    def pairs(self, batch_labels: np.ndarray | Tensor) -> Mined:
        """Masks of exactly the designated pairs (2k, 2k+1), both directions, split by label."""
        labels = torch.as_tensor(batch_labels)
        size = labels.shape[0]
        if size % 2:
            raise ValueError(f"a p_random batch has an even number of entries, got {size}")
        idx = torch.arange(size, device=labels.device)
        designated = (idx[:, None] ^ 1) == idx[None, :]  # partners 2k <-> 2k+1
        same = labels[:, None] == labels[None, :]
        return Mined(pos=designated & same, neg=designated & ~same)
