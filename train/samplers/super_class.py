"""Super-class batches: n classes x m images, the classes drawn from a few random super-classes (P x K per group)."""

from __future__ import annotations

import numpy as np

from metricsearch.train.samplers.base import Design, draw_per_class
from metricsearch.train.samplers.group import GroupSampler
from metricsearch.train.samplers.registry import register_sampler


@register_sampler("super_class")
class SuperClassSampler(GroupSampler):
    """n classes x m images per batch from s random super-classes (Omniglot: alphabets), more when they hold fewer.

    A class's negatives in a batch are then mostly of its own super-class, as in a within-alphabet episode.
    Super-classes are drawn in proportion to their classes, so each class about as often as under `group`.
    Needs the data set's groups (Omniglot's alphabets; a class belongs to the group of its first image; the images
    without one, None, make one more group).
    """

    def __init__(
        self, labels: np.ndarray, groups: np.ndarray | None = None, classes_per_batch: int = 8,
        images_per_class: int = 8, super_classes_per_batch: int = 1, seed: int = 0, rank: int = 0,
        world_size: int = 1, batches_per_epoch: int | None = None,
    ) -> None:
        super().__init__(labels, classes_per_batch, images_per_class, seed, rank, world_size, batches_per_epoch)
        if groups is None or len(groups) != len(self.labels):
            raise ValueError("sampler super_class needs the group of each image (Omniglot's alphabets); this data "
                             "set has none: use sampler group")
        names = np.asarray(groups, dtype=object).tolist()  # np.unique cannot order None among strings: None last
        ids = {g: k for k, g in enumerate(sorted(set(names), key=lambda g: (g is None, "" if g is None else g)))}
        group_ids = np.array([ids[g] for g in names])
        of_class = group_ids[[m[0] for m in self.members]]
        self.by_group = [np.flatnonzero(of_class == g) for g in np.unique(of_class)]
        self.sizes = np.array([len(g) for g in self.by_group])  # classes per super-class
        self.p = self.sizes / self.sizes.sum()  # a super-class as often as its classes: each class about equally often
        if not 1 <= super_classes_per_batch <= len(self.by_group):
            raise ValueError(f"super_classes_per_batch must be between 1 and the {len(self.by_group)} super-classes, "
                             f"got {super_classes_per_batch}")
        self.s = super_classes_per_batch

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        order = rng.choice(len(self.sizes), size=len(self.sizes), replace=False, p=self.p)
        taken = max(self.s, int(np.searchsorted(np.cumsum(self.sizes[order]), self.n)) + 1)  # enough to hold n
        pool = np.concatenate([self.by_group[g] for g in order[:taken]])
        chosen = rng.choice(pool, size=self.n, replace=False)
        return draw_per_class(rng, self.members, chosen, self.m)

    def design(self, counts: np.ndarray) -> Design | None:
        """Unknown: a pair's probability depends on the super-classes' sizes (no importance weighting)."""
        return None
