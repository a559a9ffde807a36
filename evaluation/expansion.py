"""Gallery expansion with unlabelled images from the queries' domain: catalogue entries (one studio image per
product, say) moved toward the shelf photos nearest them, so that a shelf photo finds its product more often."""

from __future__ import annotations

import numpy as np

from metricsearch.evaluation.distances import as_2d, normalized

ROUNDS = 10  # assignment rounds at most: they settle in about 5 (docs/photos.md)
CHUNK = 8192  # pool images compared with the gallery at once (bounds the similarity block's memory)


def nearest_entry(pool: np.ndarray, gallery: np.ndarray) -> np.ndarray:
    """For each pool row, the index of the gallery row of the largest inner product."""
    return np.concatenate([(pool[s:s + CHUNK] @ gallery.T).argmax(1) for s in range(0, len(pool), CHUNK)]
                          or [np.zeros(0, np.int64)])


def expand_gallery(gallery: np.ndarray, pool: np.ndarray, rounds: int = ROUNDS) -> np.ndarray:
    """Unit gallery embeddings, each its own embedding plus the mean of the pool images whose nearest entry it is,
    the assignment repeated until it settles (`rounds` at most): a k-means anchored at the gallery's entries."""
    anchors, pool = normalized(as_2d(gallery, "gallery")), normalized(as_2d(pool, "pool"))
    if pool.shape[1] != anchors.shape[1]:
        raise ValueError(f"pool embeddings have {pool.shape[1]} dimensions, the gallery's {anchors.shape[1]}: "
                         "embed both with the same model")
    if rounds < 1:
        raise ValueError(f"rounds must be 1 or more, not {rounds}")
    entries, owner = anchors, None
    for _ in range(rounds):
        nearest = nearest_entry(pool, entries)
        if owner is not None and np.array_equal(nearest, owner):
            break
        owner = nearest
        sums = np.zeros_like(anchors)
        np.add.at(sums, owner, pool)
        counts = np.bincount(owner, minlength=len(anchors))[:, None]
        entries = normalized(anchors + sums / np.maximum(counts, 1))
    return entries
