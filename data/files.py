"""`files:PATH`: every image file under a folder, recursively, without labels (a catalogue to index)."""

from __future__ import annotations

import os
from pathlib import Path

from .base import ImageSet, image_set
from .scan import IMAGE_EXTENSIONS, is_image_name


def list_images_recursively(root: Path) -> list[Path]:
    """The image files under `root` and its sub-folders (hidden ones skipped), sorted by relative path."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(folder, f) for f in files if is_image_name(f)]
    return sorted(found, key=lambda p: p.relative_to(root).parts)


def load_set(root: Path) -> ImageSet:
    """Every image under `root` as one set without labels; the files are not opened here."""
    if not root.is_dir():
        raise FileNotFoundError(f"files:{root}: folder {root} does not exist")
    paths = list_images_recursively(root)
    if not paths:
        raise ValueError(f"files:{root}: no image files under {root} "
                         f"(extensions: {', '.join(sorted(IMAGE_EXTENSIONS))})")
    return image_set(paths, [None] * len(paths))
