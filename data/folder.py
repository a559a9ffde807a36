"""A folder with one sub-folder of images per class, split by train/test sub-folders or by class."""

from __future__ import annotations

from pathlib import Path

from .base import RECALL_K_SMALL, DataSplit, ImageSet, image_set, make_split, split_by_class
from .scan import scan_class_folders

#: where a SplitClassesError's message names the command's own way to give split_classes, and to drop it
GIVE, DROP = "\x00give\x00", "\x00drop\x00"


class SplitClassesError(ValueError):
    """A data set spec and a class split fraction (split_classes) that do not go together: a folder: spec without
    train/ and test/ sub-folders needs one, a spec with its own split takes none. Its text names the Python argument;
    `worded` names the options of the command that read the spec."""

    def __init__(self, template: str) -> None:
        self.template = template  # the message, with GIVE and DROP in place of the ways to give and to drop it
        super().__init__(self.worded("split_classes=F", "drop split_classes"))

    def worded(self, give: str | None, drop: str | None) -> str:
        """The message naming `give` (e.g. `--split-classes F`) to set the fraction and `drop` (e.g. `leave out
        --split-classes`) to unset it; None for a command that cannot set it."""
        example = "(e.g. 0.5: the first half of the classes by name train, the rest test)"
        return self.template.replace(GIVE, f"pass {give} {example} or " if give else "").replace(
            DROP, drop or "drop split_classes")


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
            raise SplitClassesError(f"{spec} already has train/ and test/ sub-folders: {DROP} or point at a folder of "
                                    "class sub-folders")
        return make_split(spec, load_set(root / "train"), load_set(root / "test"), RECALL_K_SMALL)
    if split_classes is None:
        hint = " (it has only one of train/ and test/)" if has_train or has_test else ""
        raise SplitClassesError(f"{spec} has no train/ and test/ sub-folders{hint}: {GIVE}make train/ and test/ "
                                "sub-folders, each with one sub-folder per class")
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
