"""The Grocery Store data set (Klasson et al., WACV 2019): its official train/val/test lists, fine labels (coarse
ones as groups), the iconic catalogue images, and two class halves for evaluating on unseen classes.

A spec may select a part after `#`: list names joined by `+` (`train`, `val`, `test`) or `catalogue`, and/or a
class half (`half1`, `half2`), comma-separated: `grocery:PATH#test,half2` is the test-list photos of the
second half's classes, `grocery:PATH#catalogue,half2` their catalogue images. The classes, sorted by fine
class id, alternate between the halves (half1 takes the 1st, 3rd, ...), so both halves hold fruit,
vegetables and packages. As a split, `grocery:PATH[#halfN]` holds half N out (default half2): the other
half's photos train; half N's test-list photos query its train+val photos."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .base import RECALL_K, DataSplit, ImageSet, image_set, make_split
from .scan import find_root, image_path, keep_readable

LISTS = ("train", "val", "test")
CATALOGUE = "catalogue"
HALVES = ("half1", "half2")


@dataclass(frozen=True)
class GroceryClass:
    """One fine class of classes.csv."""

    name: str
    fine_id: int
    coarse: str
    iconic: str  # path under the data set folder


@dataclass(frozen=True)
class Selection:
    """The part of the data set a spec names: some official lists (or the catalogue) of some classes."""

    parts: tuple[str, ...] = LISTS
    half: str | None = None


def parse(path: Path) -> tuple[Path, Selection]:
    """The folder and the selection of a `grocery:PATH[#PART,...]` path."""
    raw, _, selector = str(path).partition("#")
    parts: tuple[str, ...] = LISTS
    half = None
    for token in filter(None, (t.strip() for t in selector.split(","))):
        if token in HALVES:
            half = token
        elif token == CATALOGUE or all(p in LISTS for p in token.split("+")):
            parts = tuple(token.split("+"))
        else:
            raise ValueError(f"grocery:{path}: unknown part {token!r}; use {'/'.join(LISTS)} (joined by +), "
                             f"{CATALOGUE}, {' or '.join(HALVES)}, comma-separated after #")
    return Path(raw), Selection(parts, half)


def read_classes(root: Path) -> list[GroceryClass]:
    """The fine classes of `root`/classes.csv, sorted by fine class id."""
    with open(root / "classes.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))[1:]
    classes = [GroceryClass(r[0].strip(), int(r[1]), r[2].strip(), r[4].strip().lstrip("/")) for r in rows if r]
    if len(classes) < 4:
        raise ValueError(f"grocery: {root / 'classes.csv'} lists {len(classes)} classes; two halves need at least 4")
    return sorted(classes, key=lambda c: c.fine_id)


def class_half(classes: list[GroceryClass]) -> dict[int, str]:
    """Fine class id -> half1 or half2: the classes, in fine-id order, alternate between the halves."""
    return {c.fine_id: HALVES[rank % 2] for rank, c in enumerate(classes)}


def _photos(root: Path, lists: tuple[str, ...], by_id: dict[int, GroceryClass]) -> tuple[list[Path], list[int]]:
    """The photos of the official lists (rows `path, fine id, coarse id`) and their fine ids, header-checked."""
    paths: list[Path] = []
    ids: list[int] = []
    for name in lists:
        index = root / f"{name}.txt"
        if not index.is_file():
            raise FileNotFoundError(f"grocery: {index} not found; point the spec at the data set folder")
        for line in index.read_text(encoding="utf-8").splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) >= 2 and fields[0]:
                if int(fields[1]) not in by_id:
                    raise ValueError(f"grocery: {index} lists class id {fields[1]}, which classes.csv lacks")
                paths.append(image_path(root, fields[0]))
                ids.append(int(fields[1]))
    return keep_readable(paths, ids, root)


def _set(root: Path, parts: tuple[str, ...], classes: list[GroceryClass], half: str | None) -> ImageSet:
    """The images of `parts` (lists or the catalogue) of the classes of `half` (all with None), fine-labelled,
    with each image's coarse class as its group."""
    halves = class_half(classes)
    by_id = {c.fine_id: c for c in classes if half is None or halves[c.fine_id] == half}
    if parts == (CATALOGUE,):
        paths, ids = keep_readable([image_path(root, c.iconic) for c in by_id.values()], list(by_id), root)
    else:
        every = {c.fine_id: c for c in classes}
        found, found_ids = _photos(root, parts, every)
        paths, ids = [p for p, i in zip(found, found_ids) if i in by_id], [i for i in found_ids if i in by_id]
    return image_set(paths, [by_id[i].name for i in ids], groups=[by_id[i].coarse for i in ids])


def _root(path: Path) -> Path:
    return find_root(path, "classes.csv", "grocery")


def load_set(path: Path) -> ImageSet:
    """The images a `grocery:PATH[#PART,...]` spec selects (default: every photo of the official lists)."""
    raw, selection = parse(path)
    root = _root(raw)
    return _set(root, selection.parts, read_classes(root), selection.half)


def load(path: Path) -> DataSplit:
    """The unseen-class split: the held-out half (`#half1`/`#half2`, default half2) tests, its test-list photos
    querying its train+val photos; every photo of the other half trains."""
    raw, selection = parse(path)
    if selection.parts != LISTS:
        raise ValueError(f"grocery:{path}: a split takes only a held-out half (#half1 or #half2); "
                         "select lists or the catalogue for --query/--gallery or index build")
    root = _root(raw)
    classes = read_classes(root)
    held_out = selection.half or HALVES[1]
    trained = HALVES[1 - HALVES.index(held_out)]
    query = _set(root, ("test",), classes, held_out)
    gallery = _set(root, ("train", "val"), classes, held_out)
    test = image_set(query.items + gallery.items,
                     [query.class_names[i] for i in query.labels] + [gallery.class_names[i] for i in gallery.labels],
                     groups=list(query.groups) + list(gallery.groups))
    n_query = len(query)
    return make_split(
        f"grocery:{path}", _set(root, LISTS, classes, trained), test, RECALL_K,
        query=test.subset(np.arange(n_query)), gallery=test.subset(np.arange(n_query, len(test))),
        notes=[f"{trained} classes train, {held_out} classes test: their test-list photos query their "
               "train+val photos"],
    )
