"""Data sets: adapters that turn a spec (`digits`, `folder:PATH`, `cub200:PATH`, ...) into a
class-disjoint split, the ImageSet container and the one safe image loader. No torch."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path

from . import cars196, csvlist, cub200, digits, files, folder, grocery, inshop, omniglot, sop
from .base import (SPLIT_MODES, DataSplit, ImageSet, concat_sets, hold_out_validation, original_images, relabel,
                   resplit, with_transformed_classes)
from .download import fetch
from .images import DEFAULT_MAX_PIXELS, UnreadableImageError, load_image, pixel_count

__all__ = ["DEFAULT_MAX_PIXELS", "PARTS", "SPLIT_MODES", "DataSplit", "ImageSet", "UnreadableImageError", "adapters",
           "concat_sets", "load_image", "load_image_set", "load_query_gallery", "load_split", "pixel_count", "resplit",
           "original_images", "with_transformed_classes"]


_DESCRIPTIONS: dict[str, str] = {
    "digits": "scikit-learn's bundled 8x8 digits, 0-4 train / 5-9 test (offline, the default)",
    "folder": "one sub-folder per class; PATH/train + PATH/test, or the classes split by name at a fraction "
              "(split_classes)",
    "omniglot": "Omniglot zips or folders: background alphabets train, evaluation test; plain `omniglot`: "
                "the two minimal background sets that ship inside the package (offline, the demo's default)",
    "cub200": "CUB-200-2011 birds: classes 1-100 train, 101-200 test",
    "cars196": "Stanford Cars196 (cars_annos.mat): classes 1-98 train, 99-196 test",
    "sop": "Stanford Online Products: Ebay_train.txt / Ebay_test.txt",
    "inshop": "In-Shop Clothes: list_eval_partition.txt train / query / gallery",
    "grocery": "Grocery Store photos: class halves (#half1/#half2 held out); #test,half2 or #catalogue,half2 select",
    "files": "every image under PATH, recursively, without labels (for indexing a catalogue)",
    "csv": "a CSV FILE with columns path and optional label; relative paths from the CSV's folder",
}
#: specs that list images without a class split: for indexing, not for training
_UNSPLIT = ("files", "csv")
PARTS = ("train", "test")
_PUBLIC: dict[str, Callable[[Path], DataSplit]] = {
    "omniglot": omniglot.load,
    "cub200": cub200.load,
    "cars196": cars196.load,
    "sop": sop.load,
    "inshop": inshop.load,
    "grocery": grocery.load,
}


def _usage(name: str) -> str:
    """The spec form of adapter `name`, e.g. `folder:PATH`."""
    return name if name == "digits" else f"{name}:FILE" if name == "csv" else f"{name}:PATH"


def _parse(spec: str) -> tuple[str, Path | None]:
    """The adapter name and PATH of a spec, with errors that say how to write it."""
    name, sep, raw = spec.strip().partition(":")
    if name not in _DESCRIPTIONS:
        close = difflib.get_close_matches(name.lower(), list(_DESCRIPTIONS), n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(map(_usage, close))}? " if close else ""
        known = ", ".join(_usage(n) for n in _DESCRIPTIONS)
        raise ValueError(f"unknown data set {spec!r}: {hint}known: {known}")
    if name == "digits":
        if sep:
            raise ValueError(f"{name} takes no path: write {name!r}, not {spec!r}")
        return name, None
    if name == "omniglot" and not sep:
        return name, omniglot.EMBEDDED
    if not raw.strip():
        raise ValueError(f"{name} needs a path: write {_usage(name)} (got {spec!r})")
    return name, Path(raw.strip()).expanduser()


def load_split(spec: str, *, download: bool = False, split_classes: float | None = None,
               split: str = "test", val_classes: float | None = None, seed: int = 0) -> DataSplit:
    """The class-disjoint train/test split named by `spec`; `download` fetches a missing public data set;
    `split` = test (as the data set defines it), swap (train and test exchanged) or all (final fit: every
    class trains, the test part is empty), see `resplit`; `val_classes` (a training run's): that fraction of the
    training classes, drawn with `seed`, becomes the validation part (`hold_out_validation`)."""
    parts = resplit(_load_split(spec, download, split_classes), split or "test")
    return parts if val_classes is None else hold_out_validation(parts, val_classes, seed)


def _load_split(spec: str, download: bool, split_classes: float | None) -> DataSplit:
    name, root = _parse(spec)
    if name in _UNSPLIT:
        raise ValueError(f"{_usage(name)} lists images without a class split: use it to index a gallery "
                         "(metricsearch index build --images SPEC), or give a folder:PATH of class sub-folders")
    if name == "folder":
        if download:
            raise ValueError("folder: data sets cannot be downloaded; drop download: true from the config")
        return folder.load(root, split_classes)
    if split_classes is not None:
        raise folder.SplitClassesError(f"{name} has a fixed class split, and split_classes applies to folder:PATH "
                                       f"only: {folder.DROP}")
    if root is None:
        return digits.load()
    try:
        return _PUBLIC[name](root)
    except FileNotFoundError:
        if not download:
            raise
    fetch(name, root)
    return _PUBLIC[name](root)


def load_image_set(spec: str, part: str | None = None, *, check: bool = True) -> ImageSet:
    """All images of any spec as one set (both parts of a split), or one `part` (train|test).

    `folder:PATH` takes PATH/train + PATH/test when both exist, else PATH's class sub-folders;
    `files:PATH` and `csv:FILE` have no labels or only the CSV's. `check=False` keeps folder
    images whose header PIL cannot read (the indexer reports them instead of skipping them here).
    """
    if part is not None and part not in PARTS:
        raise ValueError(f"part must be one of {', '.join(PARTS)}, got {part!r}")
    name, root = _parse(spec)
    if name in _UNSPLIT or (name == "folder" and not all((root / s).is_dir() for s in PARTS)):
        if part is not None:
            raise ValueError(f"{spec} has no train/test parts: drop --part")
        loader = {"files": files.load_set, "csv": csvlist.load_set}.get(name)
        return loader(root) if loader else folder.load_set(root, check)
    if name == "grocery" and part is None:
        return grocery.load_set(root)
    if name == "folder":
        parts = {s: folder.load_set(root / s, check) for s in PARTS}
    else:
        loaded = load_split(spec)
        parts = {"train": loaded.train, "test": loaded.test}
    return parts[part] if part else concat_sets(parts["train"], parts["test"])


def load_query_gallery(query_spec: str, gallery_spec: str) -> tuple[ImageSet, ImageSet]:
    """Query and gallery sets whose labels agree by class name (one label numbering for both)."""
    q, g = load_image_set(query_spec), load_image_set(gallery_spec)
    names = sorted(set(q.class_names) | set(g.class_names))
    return relabel(q, names), relabel(g, names)


def adapters() -> list[tuple[str, str]]:
    """(spec form, one-line description) of every data set adapter."""
    return [(_usage(name), text) for name, text in _DESCRIPTIONS.items()]
