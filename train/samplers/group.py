"""The (m, n)-group batch design: n classes without replacement, m images each (P x K sampling)."""

from __future__ import annotations

import warnings

import numpy as np

from metricsearch.train.samplers.registry import register_sampler
from metricsearch.train.samplers.base import Design, LabelBatchSampler, draw_per_class


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


@register_sampler("group")
class GroupSampler(LabelBatchSampler):
    """n classes x m images per batch, both without replacement.

    Rule for small classes: a class with fewer than m images contributes all of its images
    (never duplicates); classes with a single image are never drawn (they form no positive pair).
    """

    def __init__(
        self, labels: np.ndarray, classes_per_batch: int = 8, images_per_class: int = 8,
        seed: int = 0, rank: int = 0, world_size: int = 1, batches_per_epoch: int | None = None,
    ) -> None:
        super().__init__(labels, seed, rank, world_size, batches_per_epoch)
        if classes_per_batch < 2 or images_per_class < 2:
            raise ValueError(
                f"classes_per_batch and images_per_class must be >= 2, got "
                f"{classes_per_batch} and {images_per_class}"
            )
        classes, inverse = np.unique(self.labels, return_inverse=True)
        members = [np.flatnonzero(inverse == c) for c in range(len(classes))]
        self.members = [m for m in members if len(m) >= 2]
        if len(self.members) < len(members):
            warnings.warn(f"{len(members) - len(self.members)} class(es) with a single image are never sampled")
        if len(self.members) < classes_per_batch:
            raise ValueError(
                f"classes_per_batch={classes_per_batch} but only {len(self.members)} classes have "
                "two or more images; lower sampler.classes_per_batch"
            )
        self.n, self.m = classes_per_batch, images_per_class

    @property
    def batch_size(self) -> int:
        return self.n * self.m

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        chosen = rng.choice(len(self.members), size=self.n, replace=False)
        return draw_per_class(rng, self.members, chosen, self.m)

    def design(self, counts: np.ndarray) -> Design:
        """Eq. 9's Q over all ordered pairs of the m n images of a batch."""
        return Design(q_group(counts, self.m, self.n), self.batch_size * (self.batch_size - 1))
