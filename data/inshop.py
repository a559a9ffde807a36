"""In-Shop Clothes Retrieval: train items train; query items search the gallery only."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .base import RECALL_K_INSHOP, DataSplit, image_set, make_split
from .scan import find_root, image_path, keep_readable, read_rows

PARTITION = "list_eval_partition.txt"


def _image_root(root: Path, first: str) -> Path:
    """The folder the partition file's image paths are relative to (its own, or the official Img/)."""
    candidates = [root, root / "Img", root.parent, root.parent / "Img"]
    for candidate in candidates:
        if image_path(candidate, first).is_file():
            return candidate
    raise FileNotFoundError(
        f"inshop: image {first} (first row of {PARTITION}) not found under any of "
        f"{', '.join(map(str, candidates))}; extract img.zip next to {PARTITION}"
    )


def load(path: Path) -> DataSplit:
    """The In-Shop split from list_eval_partition.txt (rows `image_name item_id evaluation_status`)."""
    root = find_root(path, PARTITION, "inshop")
    rows = read_rows(root / PARTITION, skip=2)
    if not rows:
        raise ValueError(f"inshop: {root / PARTITION} lists no images")
    images = _image_root(root, rows[0][0])
    paths, kept = keep_readable([image_path(images, r[0]) for r in rows], rows, images)
    by_status: dict[str, tuple[list[Path], list[str]]] = {s: ([], []) for s in ("train", "query", "gallery")}
    for p, (_, item, status) in zip(paths, kept):
        if status not in by_status:
            raise ValueError(f"inshop: unknown evaluation_status {status!r} in {root / PARTITION}")
        by_status[status][0].append(p)
        by_status[status][1].append(item)
    (q_paths, q_items), (g_paths, g_items) = by_status["query"], by_status["gallery"]
    test = image_set(q_paths + g_paths, q_items + g_items)
    n_query = len(q_paths)
    return make_split(
        f"inshop:{root}",
        image_set(*by_status["train"]),
        test,
        RECALL_K_INSHOP,
        query=test.subset(np.arange(n_query)),
        gallery=test.subset(np.arange(n_query, len(test))),
    )
