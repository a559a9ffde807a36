"""N-pair's hard negative class mining (Sohn 2016, section 3.3) as a batch sampler."""

from __future__ import annotations

import numpy as np
from torch import Tensor

from metricsearch.train.samplers.registry import register_sampler
from metricsearch.train.samplers.base import LabelBatchSampler, draw_per_class


@register_sampler("npair_hard_class")
class HardClassSampler(LabelBatchSampler):
    """A random seed class, then greedily the classes whose means are closest to those chosen.

    Class means are running means of the embeddings seen through `observe`, folded in every
    `refresh` calls. Classes not yet seen are picked first (ties broken at random), so before any
    embedding is seen the batch is n random classes. With several ranks, pass each rank the
    gathered embeddings of all ranks so that their class means, hence their batches, agree.
    """

    def __init__(
        self, labels: np.ndarray, classes_per_batch: int = 16, images_per_class: int = 2,
        refresh: int = 1, seed: int = 0, rank: int = 0, world_size: int = 1,
        batches_per_epoch: int | None = None,
    ) -> None:
        super().__init__(labels, seed, rank, world_size, batches_per_epoch)
        if classes_per_batch < 2 or images_per_class < 2 or refresh < 1:
            raise ValueError(
                "need classes_per_batch >= 2, images_per_class >= 2 and refresh >= 1, got "
                f"{classes_per_batch}, {images_per_class}, {refresh}"
            )
        classes, inverse = np.unique(self.labels, return_inverse=True)
        eligible = np.flatnonzero(np.bincount(inverse) >= 2)
        if len(eligible) < classes_per_batch:
            raise ValueError(
                f"classes_per_batch={classes_per_batch} but only {len(eligible)} classes have two or "
                "more images"
            )
        self.class_of = inverse  # data set index -> class row
        self.members = [np.flatnonzero(inverse == c) for c in eligible]
        self.row_of = np.full(len(classes), -1)
        self.row_of[eligible] = np.arange(len(eligible))
        self.n, self.m, self.refresh = classes_per_batch, images_per_class, refresh
        self.means: np.ndarray | None = None  # eligible classes x dim, unit rows
        self.seen = np.zeros(len(eligible), dtype=bool)
        self._sums: np.ndarray | None = None
        self._counts = np.zeros(len(eligible))
        self._steps = 0

    @property
    def batch_size(self) -> int:
        return self.n * self.m

    def observe(self, indices: list[int], embeddings: Tensor) -> None:
        """Accumulate the batch's embeddings per class; fold them into the means every `refresh` calls."""
        emb = embeddings.detach().float().cpu().numpy()
        emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        rows = self.row_of[self.class_of[np.asarray(indices)]]
        keep = rows >= 0
        if self._sums is None:
            self._sums = np.zeros((len(self.members), emb.shape[1]))
            self.means = np.zeros_like(self._sums)
        np.add.at(self._sums, rows[keep], emb[keep])
        np.add.at(self._counts, rows[keep], 1.0)
        self._steps += 1
        if self._steps % self.refresh == 0:
            fresh = self._counts > 0
            mean = self._sums[fresh] / self._counts[fresh, None]
            self.means[fresh] = mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
            self.seen |= fresh
            self._sums[:] = 0.0
            self._counts[:] = 0.0

    def choose_classes(self, rng: np.random.Generator) -> np.ndarray:
        """The batch's class rows: a random seed class, then the most violating classes greedily."""
        order = rng.permutation(len(self.members))  # random tie-breaking: argmax takes the first
        if self.means is None or not self.seen.any():
            return order[: self.n]
        means = self.means[order]
        # closeness to the chosen set: max cosine similarity to a chosen class mean; unseen first
        closeness = np.where(self.seen[order], -np.inf, np.inf)
        taken = np.zeros(len(order), dtype=bool)
        chosen = 0
        for _ in range(self.n - 1):
            taken[chosen] = True
            if self.seen[order[chosen]]:
                closeness = np.maximum(closeness, means @ means[chosen])
            chosen = int(np.argmax(np.where(taken, -np.inf, closeness)))
        taken[chosen] = True
        picked = np.flatnonzero(taken)
        return order[picked]

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        return draw_per_class(rng, self.members, self.choose_classes(rng), self.m)
