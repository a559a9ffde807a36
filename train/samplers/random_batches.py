"""Plain random batches: images drawn uniformly whatever their classes (for the proxy losses, which need no pairs)."""

from __future__ import annotations

import numpy as np

from metricsearch.train.samplers.base import LabelBatchSampler
from metricsearch.train.samplers.registry import register_sampler


@register_sampler("random")
class RandomSampler(LabelBatchSampler):
    """`batch_size` distinct images drawn uniformly from the whole training set, each batch anew.

    Not one of the five papers' designs: a batch may hold one image of a class or none, which the proxy losses
    (proxy_anchor, proxy_nca, soft_triple, normsoftmax, cosface, arcface) do not need; a pair loss finds few
    positive pairs in it.
    """

    def __init__(
        self, labels: np.ndarray, batch_size: int = 64, seed: int = 0, rank: int = 0, world_size: int = 1,
        batches_per_epoch: int | None = None,
    ) -> None:
        super().__init__(labels, seed, rank, world_size, batches_per_epoch)
        if not 1 <= batch_size <= len(self.labels):
            raise ValueError(f"batch_size must be from 1 to the {len(self.labels)} training images, got {batch_size}")
        self.size = batch_size

    @property
    def batch_size(self) -> int:
        return self.size

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        return rng.choice(len(self.labels), size=self.size, replace=False)
