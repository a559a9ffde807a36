"""A folder with one sub-folder of images per class, split by train/test sub-folders or by class."""

from __future__ import annotations

from pathlib import Path

from .base import RECALL_K_SMALL, DataSplit, ImageSet, image_set, make_split, split_by_class
from .scan import scan_class_folders


def load_set(root: Path, check: bool = True) -> ImageSet:
    """All images under `root` (one sub-folder per class) as one set; `check` drops unreadable headers."""
    if not root.is_dir():
        raise FileNotFoundError(f"folder {root} does not exist")
    return image_set(*scan_class_folders(root, check))


def load(root: Path, split_classes: float | None) -> DataSplit:
    """The split of `root`: its train/ and test/ sub-folders, or its classes cut at `split_classes`."""
    spec = f"folder:{root}"
    if not root.is_dir():
        raise FileNotFoundError(f"{spec}: folder {root} does not exist")
    has_train, has_test = (root / "train").is_dir(), (root / "test").is_dir()
    if has_train and has_test:
        if split_classes is not None:
            raise ValueError(
                f"{spec} already has train/ and test/ sub-folders; drop --split-classes (train: split_classes) "
                "or point at a folder of class sub-folders"
            )
        return make_split(spec, load_set(root / "train"), load_set(root / "test"), RECALL_K_SMALL)
    if split_classes is None:
        hint = " (it has only one of train/ and test/)" if has_train or has_test else ""
        raise ValueError(
            f"{spec} has no train/ and test/ sub-folders{hint}: pass --split-classes F (`train`: --set "
            "split_classes=F; e.g. 0.5: the first half of the classes by name train, the rest test) "
            "or make train/ and test/ sub-folders, each with one sub-folder per class"
        )
    if not 0.0 < split_classes < 1.0:
        raise ValueError(f"split_classes must be between 0 and 1 (exclusive), got {split_classes}")
    items, keys = scan_class_folders(root)
    names = sorted(set(keys))
    train_names = set(names[: round(split_classes * len(names))])
    return split_by_class(
        spec,
        items,
        keys,
        lambda k: k in train_names,
        RECALL_K_SMALL,
        notes=[f"classes split by name: first {len(train_names)} of {len(names)} train, the rest test"],
    )
