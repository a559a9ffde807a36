"""Stanford Online Products: Ebay_train.txt classes train, Ebay_test.txt classes test."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from .base import RECALL_K_SOP, DataSplit, ImageSet, image_set, make_split
from .scan import find_root, image_path, keep_readable, read_rows


def _load_index(root: Path, index: str) -> ImageSet:
    """The images listed in one Ebay_*.txt (header `image_id class_id super_class_id path`); each class's
    super-class folder (e.g. `bicycle_final`) is its group."""
    rows = read_rows(root / index, skip=1)
    folder = {int(cid): str(PurePosixPath(rel).parent) for _, cid, _, rel in rows}
    paths, keys = keep_readable([image_path(root, rel) for *_, rel in rows], [int(r[1]) for r in rows], root)
    return image_set(paths, keys, names={cid: f"{f}/{cid}" for cid, f in folder.items()},
                     groups=[folder[k] for k in keys])


def load(path: Path) -> DataSplit:
    """The Stanford Online Products split under `path`."""
    root = find_root(path, "Ebay_train.txt", "sop")
    if not (root / "Ebay_test.txt").is_file():
        raise FileNotFoundError(f"sop: Ebay_test.txt not found next to {root / 'Ebay_train.txt'}")
    return make_split(
        f"sop:{root}", _load_index(root, "Ebay_train.txt"), _load_index(root, "Ebay_test.txt"), RECALL_K_SOP
    )
