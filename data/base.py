"""The image-set and split containers every adapter returns, and the helpers that build them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from PIL import Image

from .images import load_image

RECALL_K_SMALL: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
RECALL_K_SOP: tuple[int, ...] = (1, 10, 100, 1000)
RECALL_K_INSHOP: tuple[int, ...] = (1, 10, 20, 30, 40, 50)


@dataclass
class ImageSet:
    """Images (file paths or in-memory uint8 arrays) with contiguous integer labels; -1 marks an image
    without a label (`files:` specs, CSV rows with an empty label)."""

    items: list
    labels: np.ndarray
    class_names: list[str]
    mode: str | None = None  # convert loaded images to this PIL mode; None keeps the stored mode

    def __len__(self) -> int:
        return len(self.items)

    def load(self, i: int) -> Image.Image:
        """Image i, fully decoded by `load_image` (converted to `mode` when set)."""
        return load_image(self.items[i], self.mode)

    def class_counts(self) -> dict[int, int]:
        """Map each label to its number of images."""
        return {int(k): int(v) for k, v in sorted(Counter(self.labels.tolist()).items())}

    def subset(self, indices) -> ImageSet:
        """The images at `indices`, keeping labels and class_names unchanged."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        return replace(self, items=[self.items[i] for i in idx], labels=self.labels[idx])


def relabel(s: ImageSet, names: Sequence[str]) -> ImageSet:
    """`s` with its labels renumbered as indices into `names` (which holds all of its class names)."""
    index = {n: i for i, n in enumerate(names)}
    labels = np.array([index[s.class_names[label]] if label >= 0 else -1 for label in s.labels], dtype=np.int64)
    return replace(s, labels=labels, class_names=list(names))


def concat_sets(*sets: ImageSet) -> ImageSet:
    """One ImageSet of all images of `sets`, in order, labels agreeing by class name."""
    names = sorted(set().union(*(s.class_names for s in sets)))
    parts = [relabel(s, names) for s in sets]
    modes = {s.mode for s in sets}
    return ImageSet(
        items=[item for s in parts for item in s.items],
        labels=np.concatenate([s.labels for s in parts]) if parts else np.zeros(0, np.int64),
        class_names=names,
        mode=modes.pop() if len(modes) == 1 else None,
    )


@dataclass
class DataSplit:
    """A class-disjoint train/test split as the papers use it."""

    spec: str
    train: ImageSet
    test: ImageSet
    recall_k: tuple[int, ...]
    query: ImageSet | None = None
    gallery: ImageSet | None = None
    notes: list[str] = field(default_factory=list)


def image_set(
    items: Sequence,
    keys: Sequence[Hashable],
    names: Mapping[Hashable, str] | None = None,
    mode: str | None = None,
) -> ImageSet:
    """An ImageSet whose labels number the sorted distinct class keys 0..C-1 (a None key: label -1)."""
    classes = sorted({k for k in keys if k is not None})
    label_of = {k: i for i, k in enumerate(classes)}
    label_of[None] = -1
    return ImageSet(
        items=list(items),
        labels=np.array([label_of[k] for k in keys], dtype=np.int64),
        class_names=[names[k] if names is not None else str(k) for k in classes],
        mode=mode,
    )


def make_split(
    spec: str,
    train: ImageSet,
    test: ImageSet,
    recall_k: tuple[int, ...],
    *,
    query: ImageSet | None = None,
    gallery: ImageSet | None = None,
    notes: Sequence[str] = (),
) -> DataSplit:
    """A DataSplit, after checking both parts have images of at least 2 classes."""
    for part, s in (("train", train), ("test", test)):
        if len(s) == 0:
            raise ValueError(f"{spec}: the {part} part has no images")
        n = len(np.unique(s.labels))
        if n < 2:
            raise ValueError(
                f"{spec}: the {part} part has {n} class(es); metric learning needs at least 2 "
                "classes on each side (add classes or change the split)"
            )
    return DataSplit(spec, train, test, recall_k, query=query, gallery=gallery, notes=list(notes))


def split_by_class(
    spec: str,
    items: Sequence,
    keys: Sequence[Hashable],
    is_train: Callable[[Hashable], bool],
    recall_k: tuple[int, ...],
    *,
    names: Mapping[Hashable, str] | None = None,
    mode: str | None = None,
    notes: Sequence[str] = (),
) -> DataSplit:
    """A DataSplit putting the images whose class key passes `is_train` in train, the rest in test."""
    parts: dict[bool, tuple[list, list]] = {True: ([], []), False: ([], [])}
    for item, key in zip(items, keys):
        part_items, part_keys = parts[bool(is_train(key))]
        part_items.append(item)
        part_keys.append(key)
    train, test = (image_set(*parts[side], names=names, mode=mode) for side in (True, False))
    return make_split(spec, train, test, recall_k, notes=notes)

