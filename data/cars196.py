"""Stanford Cars196 (cars_annos.mat): classes 1-98 train, 99-196 test."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .base import RECALL_K_SMALL, DataSplit, split_by_class
from .scan import find_root, image_path, keep_readable


def load(path: Path) -> DataSplit:
    """The Cars196 split from cars_annos.mat (fields relative_im_path, class) under `path`."""
    try:
        from scipy.io import loadmat
    except ModuleNotFoundError as exc:
        raise ValueError("cars196: reading cars_annos.mat needs scipy: pip install 'metricsearch[train]'") from exc

    root = find_root(path, "cars_annos.mat", "cars196")
    mat = loadmat(root / "cars_annos.mat", squeeze_me=True)
    ann = np.atleast_1d(mat["annotations"])
    names = None
    if "class_names" in mat:
        names = {i + 1: str(n) for i, n in enumerate(np.atleast_1d(mat["class_names"]))}
    paths, keys = keep_readable(
        [image_path(root, str(rel)) for rel in ann["relative_im_path"]],
        [int(c) for c in ann["class"]],
        root,
    )
    return split_by_class(f"cars196:{root}", paths, keys, lambda c: c <= 98, RECALL_K_SMALL, names=names)
