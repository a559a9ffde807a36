"""Which augment_classes copies of a class look alike (a symmetric character's mirror is the same drawing)."""

from __future__ import annotations

import numpy as np
from PIL import ImageFilter

from metricsearch.data import ImageSet
from metricsearch.models.preprocessing import Preprocessing

#: a copy is "the same drawing" when its images correlate with its class's images at least this well,
#: relative to how well the class's own images (different drawers) correlate with each other
SAME_RATIO = 0.9
#: images per class compared (the first ones of each class)
PER_CLASS = 8


def copy_groups(images: ImageSet, preprocessing: Preprocessing, mode: str) -> np.ndarray:
    """Per class of `images`, a group id; a class and the copies it is not to be told apart from share one.

    `mode` none: a class and all of its augment_classes copies share one; distinct: only those of them that look
    alike (a symmetric character and its mirror: the same drawing under two labels) share one.
    """
    origin = getattr(images, "class_origin", None)
    if origin is None:
        raise ValueError(f"copy_negatives: {mode} is about augment_classes copies: it needs augment_classes "
                         "(or set copy_negatives: all)")
    origin = np.asarray(origin, dtype=np.int64)
    if mode == "none":
        return origin
    return same_drawing_groups(images, origin, preprocessing)


def same_drawing_groups(images: ImageSet, origin: np.ndarray, preprocessing: Preprocessing) -> np.ndarray:
    """Per class, the smallest class among its origin's copies (itself included) that it looks like, through
    a chain: two copies look alike when their images correlate at least SAME_RATIO times as well as the
    origin's own images (other drawers) with each other, at the model's input blurred by a pixel."""
    first = {c: np.flatnonzero(images.labels == c)[:PER_CLASS] for c in range(len(origin))}

    def pixels(indices: np.ndarray) -> np.ndarray:
        rows = []
        for i in indices:
            image = preprocessing.resized(images.load(int(i)).convert("L")).filter(ImageFilter.GaussianBlur(1))
            ink = 255.0 - np.asarray(image, dtype=np.float64).ravel()
            ink -= ink.mean()
            rows.append(ink / max(np.linalg.norm(ink), 1e-9))
        return np.stack(rows)

    groups = np.arange(len(origin))
    for o in np.unique(origin):
        members = np.flatnonzero(origin == o)  # o first: the copies' classes come after their origin's
        views = [pixels(first[c]) for c in members]
        n = len(views[0])
        if n < 2:
            continue
        gram = views[0] @ views[0].T
        within = (gram.sum() - np.trace(gram)) / (n * (n - 1))
        alike = np.array([[(a @ b.T).mean() >= SAME_RATIO * within for b in views] for a in views])
        reach = alike
        for _ in range(len(members)):  # the transitive closure: a chain of look-alikes is one group
            reach = reach | (reach.astype(np.int64) @ reach.astype(np.int64) > 0)
        groups[members] = members[reach.argmax(axis=1)]  # the first (smallest) class each one reaches
    return groups
