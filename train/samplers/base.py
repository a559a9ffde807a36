"""The sampler contract: epoch-seeded, shard-aware batch samplers over a data set's labels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Iterator, Sequence

import numpy as np
from torch import Tensor
from torch.utils.data import Sampler

from metricsearch.train.losses.base import Mined


@dataclass(frozen=True)
class Design:
    """A batch design's pair probabilities Q (C x C over class pairs) and its pair slots per batch.

    Q(c, d) is the probability of one ordered image pair with classes (c, d) per pair slot: the
    probability that a batch holds it, over `slots`, the ordered pairs a batch compares.
    """

    q: np.ndarray
    slots: int


def draw_per_class(rng: np.random.Generator, members: Sequence[np.ndarray], classes: np.ndarray, m: int) -> np.ndarray:
    """m distinct images of each of `classes` (all images of a class with fewer), concatenated."""
    return np.concatenate([rng.choice(members[c], size=min(m, len(members[c])), replace=False) for c in classes])


class LabelBatchSampler(Sampler[list[int]]):
    """Yields lists of data set indices; batches depend only on (seed, epoch), split across ranks."""

    #: whether a batch is a list of designated pairs (`pairs` names them) rather than a set of images
    fixes_pairs: ClassVar[bool] = False

    def __init__(
        self, labels: np.ndarray, seed: int = 0, rank: int = 0, world_size: int = 1,
        batches_per_epoch: int | None = None,
    ) -> None:
        labels = np.asarray(labels)
        if labels.ndim != 1 or len(labels) == 0:
            raise ValueError("labels must be a non-empty 1-D array of class ids")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        self.labels = labels
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch = 0
        self._batches_per_epoch = batches_per_epoch

    @property
    def batch_size(self) -> int:
        """Nominal number of indices per batch."""
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose batches `__iter__` yields (a new draw each epoch)."""
        self.epoch = epoch

    def __len__(self) -> int:
        if self._batches_per_epoch is not None:
            return self._batches_per_epoch
        return max(1, len(self.labels) // (self.batch_size * self.world_size))

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        total = len(self) * self.world_size
        for b in range(total):
            batch = self.draw(rng)  # every rank draws every batch: same RNG stream, disjoint shares
            if b % self.world_size == self.rank:
                yield [int(i) for i in batch]

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """One batch of indices."""
        raise NotImplementedError

    def observe(self, indices: list[int], embeddings: Tensor) -> None:
        """Called by the trainer after each step with the batch's detached embeddings."""

    def pairs(self, batch_labels: np.ndarray | Tensor) -> Mined | None:
        """The pairs a pair-list design fixes within a batch (None: all pairs of the batch count)."""
        return None

    def design(self, counts: np.ndarray) -> Design | None:
        """The pair probabilities of the batches over classes with `counts` images; None when unknown."""
        return None
