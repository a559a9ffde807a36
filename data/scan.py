"""Finding image files and index files on disk, shared by all adapters."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from .download import SOURCES
from .images import UNREADABLE_ERRORS

#: how a data set with a direct download URL gets into the folder its spec names; true whichever command
#: reports the folder missing (only a training config can ask for the download)
DOWNLOAD_HINT = "let a training run download it into that folder with the config key download: true"

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})


def is_image_name(name: str) -> bool:
    """Whether a file name has one of the image extensions (case-insensitive)."""
    return Path(name).suffix.lower() in IMAGE_EXTENSIONS and not Path(name).name.startswith(".")


def list_images(folder: Path) -> list[Path]:
    """The files directly in `folder` with an image extension, sorted by name."""
    return sorted(p for p in folder.iterdir() if p.is_file() and is_image_name(p.name))


def warn_unreadable(bad: list[str], where: object) -> None:
    """Issue one warning counting the images that were skipped as unreadable."""
    if bad:
        warnings.warn(
            f"skipped {len(bad)} unreadable image(s) under {where}, e.g. {bad[0]}", stacklevel=3
        )


def keep_readable(paths: Sequence[Path], keys: Sequence, where: object) -> tuple[list[Path], list]:
    """The paths whose image header PIL can read, with their keys; the others are skipped with one warning."""
    good: list[Path] = []
    good_keys: list = []
    bad: list[str] = []
    for p, key in zip(paths, keys):
        try:
            with Image.open(p):
                good.append(p)
                good_keys.append(key)
        except UNREADABLE_ERRORS:
            bad.append(str(p))
    warn_unreadable(bad, where)
    return good, good_keys


def class_folders(root: Path) -> list[Path]:
    """The class sub-folders of `root`, sorted by name (hidden folders ignored)."""
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def scan_class_folders(root: Path, check: bool = True) -> tuple[list[Path], list[str]]:
    """Images (with `check`, those PIL can read the header of) and their class keys (folder names)
    under one-folder-per-class `root`."""
    folders = class_folders(root)
    if not folders:
        raise ValueError(f"no class sub-folders in {root}: expected one sub-folder of images per class")
    found = [(p, f) for f in folders for p in list_images(f)]
    paths, owners = [p for p, _ in found], [f for _, f in found]
    if check:
        paths, owners = keep_readable(paths, owners, root)
    empty = sorted(set(folders) - set(owners))
    if empty:
        raise ValueError(
            f"class folder(s) {', '.join(map(str, empty))} have no readable images "
            f"(extensions: {', '.join(sorted(IMAGE_EXTENSIONS))}); add images or remove the folder(s)"
        )
    return paths, [f.name for f in owners]


def find_root(path: Path, marker: str, what: str) -> Path:
    """`path` or its sub-folder that contains the file `marker`; FileNotFoundError if neither does."""
    get = f", or {DOWNLOAD_HINT}" if what in SOURCES else ""
    if not path.is_dir():
        raise FileNotFoundError(f"{what}: folder {path} does not exist (check the path{get})")
    for candidate in [path, *class_folders(path)]:
        if (candidate / marker).is_file():
            return candidate
    raise FileNotFoundError(
        f"{what}: {marker} not found in {path} or its sub-folders; point the spec at the extracted data set folder{get}"
    )


def read_rows(index: Path, skip: int = 0) -> list[list[str]]:
    """The whitespace-separated fields of each non-empty line of a text index, after `skip` lines."""
    lines = index.read_text(encoding="utf-8").splitlines()[skip:]
    return [line.split() for line in lines if line.strip()]


def image_path(root: Path, relative: str) -> Path:
    """The file `relative` (as an index file writes it, '/' separated) under `root`."""
    return root.joinpath(*relative.replace("\\", "/").split("/"))
