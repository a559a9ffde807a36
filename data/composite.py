"""Composite classes: one half of a character joined to the other half of another of its group, per source."""

from __future__ import annotations

import numpy as np

from .base import COMPOSITE_MARK, ImageSet, concat_sets


def _centre(a: np.ndarray) -> tuple[int, int]:
    """The centre (row, column) of the box around a drawing's ink (dark pixels); the image's centre if none."""
    rows, cols = np.flatnonzero((a < 128).any(1)), np.flatnonzero((a < 128).any(0))
    if not len(rows):
        return a.shape[0] // 2, a.shape[1] // 2
    return (rows[0] + rows[-1]) // 2, (cols[0] + cols[-1]) // 2


def _joined(a: np.ndarray, b: np.ndarray, cut: str) -> np.ndarray:
    """`a`'s top (or left) half joined to `b`'s bottom (or right) half, cut through the centres of their ink
    boxes, `a` shifted so that both centres meet; both the same shape, white (255) where `a` is shifted off."""
    (ra, ca), (rb, cb) = _centre(a), _centre(b)
    dr, dc = rb - ra, cb - ca
    h, w = a.shape
    shifted = np.full_like(a, 255)
    shifted[max(dr, 0):h + min(dr, 0), max(dc, 0):w + min(dc, 0)] = a[max(-dr, 0):h + min(-dr, 0),
                                                                      max(-dc, 0):w + min(-dc, 0)]
    out = b.copy()
    if cut == "tb":
        out[:rb] = shifted[:rb]
    else:
        out[:, :cb] = shifted[:, :cb]
    return out


def with_composite_classes(images: ImageSet, per_class: float, seed: int = 0) -> ImageSet:
    """The set plus about `per_class` x its classes new ones, each a class's top (left) half joined to the
    bottom (right) half of another class of its group, drawing by drawing of the same source (drawer)."""
    if per_class <= 0:
        return images
    if images.groups is None or images.sources is None:
        raise ValueError("composite_classes needs a data set with groups and sources (Omniglot's alphabets, drawers)")
    rng = np.random.default_rng(seed)
    labels = np.asarray(images.labels)
    by_class = {c: {images.sources[i]: i for i in np.flatnonzero(labels == c)} for c in np.unique(labels) if c >= 0}
    group_of = {c: images.groups[next(iter(m.values()))] for c, m in by_class.items()}
    n_new = int(round(per_class * len(by_class)))
    firsts = rng.choice(sorted(by_class), size=n_new, replace=n_new > len(by_class))
    items, new_labels, groups, sources, names = [], [], [], [], []
    for k, a in enumerate(firsts):
        mates = [c for c in by_class if c != a and group_of[c] == group_of[a]]
        if not mates:
            continue
        b = mates[rng.integers(len(mates))]
        cut = ("tb", "lr")[rng.integers(2)]
        names.append(f"{images.class_names[a]}{COMPOSITE_MARK}{images.class_names[b]}|{cut}#{k}")
        for src in sorted(set(by_class[a]) & set(by_class[b])):
            ia, ib = by_class[a][src], by_class[b][src]
            items.append(_joined(np.asarray(images.load(ia)), np.asarray(images.load(ib)), cut))
            new_labels.append(len(names) - 1)
            groups.append(images.groups[ia])
            sources.append(src)
    extra = ImageSet(items, np.asarray(new_labels, dtype=np.int64), names, images.mode,
                     np.asarray(groups, dtype=object), np.asarray(sources, dtype=object))
    return concat_sets(images, extra)
