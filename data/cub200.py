"""CUB-200-2011 birds: classes 1-100 train, 101-200 test."""

from __future__ import annotations

from pathlib import Path

from .base import RECALL_K_SMALL, DataSplit, split_by_class
from .scan import find_root, image_path, keep_readable, read_rows


def load(path: Path) -> DataSplit:
    """The CUB-200-2011 split from images.txt, image_class_labels.txt and classes.txt under `path`."""
    root = find_root(path, "images.txt", "cub200")
    names = {int(cid): name for cid, name in read_rows(root / "classes.txt")}
    class_of = {iid: int(cid) for iid, cid in read_rows(root / "image_class_labels.txt")}
    rows = read_rows(root / "images.txt")
    paths, keys = keep_readable(
        [image_path(root / "images", rel) for _, rel in rows], [class_of[iid] for iid, _ in rows], root
    )
    return split_by_class(f"cub200:{root}", paths, keys, lambda c: c <= 100, RECALL_K_SMALL, names=names)
