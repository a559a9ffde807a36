"""The image-set and split containers every adapter returns, and the helpers that build them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from PIL import Image

from .images import load_image

#: the K of Recall@K, defined here once for the package: where neither the caller nor the data set names
#: them (and Grocery's), the small benchmarks' (CUB, Cars, digits, Omniglot, folders, a gallery's own
#: evaluation), SOP's, and In-Shop's (also any query set against a separate gallery)
RECALL_K: tuple[int, ...] = (1, 2, 4, 8)
RECALL_K_SMALL: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
RECALL_K_SOP: tuple[int, ...] = (1, 10, 100, 1000)
RECALL_K_INSHOP: tuple[int, ...] = (1, 10, 20, 30, 40, 50)


#: the optional per-image metadata fields of an ImageSet, kept image by image wherever images are taken or joined
PER_IMAGE: tuple[str, ...] = ("groups", "sources")


@dataclass
class ImageSet:
    """Images (file paths or in-memory uint8 arrays) with contiguous integer labels; -1 marks an image
    without a label (`files:` specs, CSV rows with an empty label)."""

    items: list
    labels: np.ndarray
    class_names: list[str]
    mode: str | None = None  # convert loaded images to this PIL mode; None keeps the stored mode
    #: optional per-image metadata: the group of each image's class (Omniglot: its alphabet; SOP, Grocery: its
    #: super-class) and the source of each image (Omniglot: its drawer); one-shot episodes and the super_class
    #: sampler use them
    groups: np.ndarray | None = None
    sources: np.ndarray | None = None

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
        meta = {k: getattr(self, k)[idx] for k in PER_IMAGE if getattr(self, k) is not None}
        return replace(self, items=[self.items[i] for i in idx], labels=self.labels[idx], **meta)


def relabel(s: ImageSet, names: Sequence[str]) -> ImageSet:
    """`s` with its labels renumbered as indices into `names` (which holds all of its class names)."""
    index = {n: i for i, n in enumerate(names)}
    labels = np.array([index[s.class_names[label]] if label >= 0 else -1 for label in s.labels], dtype=np.int64)
    return replace(s, labels=labels, class_names=list(names))


def concat_sets(*sets: ImageSet) -> ImageSet:
    """One ImageSet of all images of `sets`, in order, labels agreeing by class name; groups and sources kept
    where every set has them."""
    names = sorted(set().union(*(s.class_names for s in sets)))
    parts = [relabel(s, names) for s in sets]
    modes = {s.mode for s in sets}
    meta = {key: np.concatenate([getattr(s, key) for s in parts]) for key in PER_IMAGE
            if parts and all(getattr(s, key) is not None for s in parts)}
    return ImageSet(
        items=[item for s in parts for item in s.items],
        labels=np.concatenate([s.labels for s in parts]) if parts else np.zeros(0, np.int64),
        class_names=names,
        mode=modes.pop() if len(modes) == 1 else None,
        **meta,
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
    #: classes carved out of the training classes (`hold_out_validation`): not trained on, they choose the checkpoint
    val: ImageSet | None = None


def image_set(
    items: Sequence,
    keys: Sequence[Hashable],
    names: Mapping[Hashable, str] | None = None,
    mode: str | None = None,
    groups: Sequence[str] | None = None,
    sources: Sequence[str] | None = None,
) -> ImageSet:
    """An ImageSet whose labels number the sorted distinct class keys 0..C-1 (a None key: label -1), with
    optional per-image groups and sources (see ImageSet)."""
    classes = sorted({k for k in keys if k is not None})
    label_of = {k: i for i, k in enumerate(classes)}
    label_of[None] = -1
    return ImageSet(
        items=list(items),
        labels=np.array([label_of[k] for k in keys], dtype=np.int64),
        class_names=[names[k] if names is not None else str(k) for k in classes],
        mode=mode,
        groups=None if groups is None else np.array(groups, dtype=object),
        sources=None if sources is None else np.array(sources, dtype=object),
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
    groups: Sequence[str] | None = None,
    sources: Sequence[str] | None = None,
) -> DataSplit:
    """A DataSplit putting the images whose class key passes `is_train` in train, the rest in test
    (optional per-image `groups` and `sources` follow their images)."""
    side = [bool(is_train(key)) for key in keys]

    def part(values: Sequence | None, train: bool) -> list | None:
        return None if values is None else [v for v, s in zip(values, side) if s == train]

    train, test = (
        image_set(part(items, s), part(keys, s), names=names, mode=mode, groups=part(groups, s),
                  sources=part(sources, s))
        for s in (True, False)
    )
    return make_split(spec, train, test, recall_k, notes=notes)


#: the ways `resplit` can use a data set's split
SPLIT_MODES = ("test", "swap", "all")


def resplit(split: DataSplit, mode: str = "test") -> DataSplit:
    """The split as `mode` says: `test` as it is (train classes train, test classes measure), `swap` with
    train and test exchanged (the second fold of a 2-fold cross-validation over classes), `all` for a
    final fit: every class of both parts trains and nothing is held out (the test part is empty)."""
    if mode == "test":
        return split
    if mode == "swap":
        note = "split swapped: the usual test classes train, the usual train classes test"
        return replace(split, train=split.test, test=split.train, query=None, gallery=None,
                       notes=[*split.notes, note])
    if mode == "all":
        train = concat_sets(split.train, split.test)
        note = (f"final fit: all {len(train.class_names)} classes ({len(train)} images) train, "
                "none held out, no evaluation")
        return replace(split, train=train, test=train.subset([]), query=None, gallery=None,
                       notes=[*split.notes, note])
    raise ValueError(f"unknown split {mode!r}; choose one of {', '.join(SPLIT_MODES)}")


#: the fewest validation classes (and training classes left beside them) a run chooses its checkpoint with; with
#: fewer it keeps its last epoch (at val_classes 0.2: 8 training classes or more validate)
MIN_VAL_CLASSES = 2


def hold_out_validation(split: DataSplit, fraction: float, seed: int) -> DataSplit:
    """The split with round(`fraction` x its training classes), drawn with `seed`, moved from train to `val` (every
    image of those classes; they are never trained on), and a note saying so; the split as it is, with a note on what
    the run keeps instead, for a final fit (nothing held out), a fraction of 0, or too few classes (MIN_VAL_CLASSES)."""
    if len(split.test) == 0:
        return split
    names = split.train.class_names
    count = round(fraction * len(names))
    if fraction == 0 or count < MIN_VAL_CLASSES or len(names) - count < MIN_VAL_CLASSES:
        why = ("val_classes is 0" if fraction == 0 else
               f"at val_classes {fraction:g}, {count} of the {len(names)} training classes would validate, too few "
               f"(choosing a checkpoint takes {MIN_VAL_CLASSES} of them and {MIN_VAL_CLASSES} left to train)")
        return replace(split, notes=[*split.notes, f"no validation classes: {why}; best.pt is the last epoch, "
                                                   "which the test classes score once at the end"])
    chosen = np.sort(np.random.default_rng(seed).choice(len(names), size=count, replace=False))
    held = np.isin(split.train.labels, chosen)
    shown = ", ".join(names[k] for k in chosen[:5]) + (", ..." if count > 5 else "")
    note = (f"validation: {count} of the {len(names)} training classes ({shown}; drawn with seed {seed}) choose the "
            "checkpoint and are not trained on; the test classes are scored once, at the end")
    return replace(split, train=_own_classes(split.train.subset(np.flatnonzero(~held))),
                   val=_own_classes(split.train.subset(np.flatnonzero(held))), notes=[*split.notes, note])


def _own_classes(images: ImageSet) -> ImageSet:
    """`images` relabelled to the classes it holds (0..C-1 in name order)."""
    return relabel(images, sorted({images.class_names[k] for k in images.labels}))



#: class transforms: the 7 non-identity symmetries of the square (PIL transposes, exact on pixels)
CLASS_TRANSFORMS: dict[str, Image.Transpose] = {
    "rot90": Image.Transpose.ROTATE_90, "rot180": Image.Transpose.ROTATE_180, "rot270": Image.Transpose.ROTATE_270,
    "flip_lr": Image.Transpose.FLIP_LEFT_RIGHT, "flip_tb": Image.Transpose.FLIP_TOP_BOTTOM,
    "transpose": Image.Transpose.TRANSPOSE, "transverse": Image.Transpose.TRANSVERSE,
}


@dataclass
class TransformedImageSet(ImageSet):
    """An ImageSet whose image i is `items[i]` transposed by `transforms[i]` ("" = as it is)."""

    transforms: np.ndarray | None = None

    def load(self, i: int) -> Image.Image:
        image = super().load(i)
        name = self.transforms[i] if self.transforms is not None else ""
        return image.transpose(CLASS_TRANSFORMS[name]) if name else image

    def subset(self, indices) -> ImageSet:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        return replace(super().subset(idx), transforms=self.transforms[idx])


def with_transformed_classes(images: ImageSet, transforms: Sequence[str] = ()) -> ImageSet:
    """The set plus, for each name in `transforms` (e.g. rot90, rot180, rot270), a transformed copy of
    every image as new classes: a rotated character is another character. Training data only."""
    transforms = list(transforms or ())
    unknown = [t for t in transforms if t not in CLASS_TRANSFORMS]
    if unknown or len(set(transforms)) != len(transforms):
        raise ValueError(f"augment_classes takes distinct names from {', '.join(CLASS_TRANSFORMS)}; got {transforms}")
    if not transforms:
        return images
    n, k = len(images), len(images.class_names)
    names = ["", *transforms]
    meta = {key: np.concatenate([getattr(images, key)] * len(names)) for key in PER_IMAGE
            if getattr(images, key) is not None}
    return TransformedImageSet(
        items=list(images.items) * len(names),
        labels=np.concatenate([images.labels + j * k for j in range(len(names))]).astype(np.int64),
        class_names=[f"{c}@{t}" if t else c for t in names for c in images.class_names],
        mode=images.mode,
        transforms=np.repeat(np.array(names, dtype=object), n),
        **meta,
    )


def original_images(images: ImageSet) -> ImageSet:
    """The set without the transformed copies that `with_transformed_classes` added (the set itself if none)."""
    if not isinstance(images, TransformedImageSet) or images.transforms is None:
        return images
    return images.subset(np.flatnonzero(images.transforms == ""))
