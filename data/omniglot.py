"""Omniglot from its official zips or extracted folders: background alphabets train, evaluation test."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

from .base import RECALL_K_SMALL, DataSplit, split_by_class
from .images import UNREADABLE_ERRORS
from .scan import DOWNLOAD_HINT, class_folders, is_image_name, keep_readable, list_images, warn_unreadable

#: the two minimal background sets shipped in the package (MIT licence beside them): the spec `omniglot`
EMBEDDED = Path(__file__).with_name("omniglot_small")
BACKGROUND = ("images_background", "images_background_small1", "images_background_small2")
EVALUATION = ("images_evaluation",)

Entry = tuple[str, str, str]  # (alphabet, characterNN, file name)


def _read_zip(archive: Path) -> tuple[list[Entry], list[np.ndarray]]:
    """The drawings in one archive, decoded in memory to uint8 gray arrays."""
    entries: list[Entry] = []
    arrays: list[np.ndarray] = []
    bad: list[str] = []
    try:
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                parts = info.filename.split("/")
                if info.is_dir() or len(parts) < 3 or "__MACOSX" in parts or not is_image_name(parts[-1]):
                    continue
                try:
                    with Image.open(io.BytesIO(z.read(info))) as im:
                        arrays.append(np.asarray(im.convert("L")))
                except UNREADABLE_ERRORS:
                    bad.append(info.filename)
                    continue
                entries.append((parts[-3], parts[-2], parts[-1]))
    except zipfile.BadZipFile as e:
        raise ValueError(f"omniglot: {archive} is not a readable zip archive ({e}); download it again") from e
    warn_unreadable(bad, archive)
    return entries, arrays


def _read_folder(folder: Path) -> tuple[list[Entry], list[Path]]:
    """The drawings in one extracted set folder (`<Alphabet>/characterNN/*.png`), header-checked."""
    found = [
        (p, (alphabet.name, character.name, p.name))
        for alphabet in class_folders(folder)
        for character in class_folders(alphabet)
        for p in list_images(character)
    ]
    paths, entries = keep_readable([p for p, _ in found], [e for _, e in found], folder)
    return entries, paths


def _read_sets(root: Path, names: tuple[str, ...]) -> tuple[list[str], list[Entry], list]:
    """The sources found among `names` (folder preferred over zip) and their drawings."""
    sources: list[str] = []
    entries: list[Entry] = []
    items: list = []
    for name in names:
        if (root / name).is_dir():
            e, i = _read_folder(root / name)
            sources.append(name)
        elif (root / f"{name}.zip").is_file():
            e, i = _read_zip(root / f"{name}.zip")
            sources.append(f"{name}.zip")
        else:
            continue
        entries += e
        items += i
    return sources, entries, items


def load(root: Path) -> DataSplit:
    """The Omniglot split; with only one kind of set present, alphabets alternate between train and test."""
    spec = f"omniglot:{root}"
    if not root.is_dir():
        raise FileNotFoundError(f"{spec}: folder {root} does not exist (check the path, or {DOWNLOAD_HINT})")
    bg_sources, bg_entries, bg_items = _read_sets(root, BACKGROUND)
    ev_sources, ev_entries, ev_items = _read_sets(root, EVALUATION)
    if not bg_sources and not ev_sources:
        expected = ", ".join(f"{n}[.zip]" for n in BACKGROUND + EVALUATION)
        raise FileNotFoundError(f"{spec}: none of {expected} found in {root}; {DOWNLOAD_HINT}")
    unique: dict[Entry, object] = {}
    for entry, item in zip(bg_entries + ev_entries, bg_items + ev_items):
        unique.setdefault(entry, item)
    if not unique:
        raise ValueError(f"{spec}: {', '.join(bg_sources + ev_sources)} hold no images")
    notes = [f"read {', '.join(bg_sources + ev_sources)}: {len(unique)} images"]
    duplicates = len(bg_entries) + len(ev_entries) - len(unique)
    if duplicates:
        notes.append(
            f"dropped {duplicates} duplicate image(s) found in more than one set (same alphabet/character/file)"
        )
    if bg_sources and ev_sources:
        train_alphabets = {a for a, _, _ in bg_entries}
        notes.append("background alphabets train, evaluation alphabets test")
    else:
        alphabets = sorted({a for a, _, _ in unique})
        train_alphabets = set(alphabets[0::2])
        notes.append(
            f"only {'background' if bg_sources else 'evaluation'} sets found: alphabets split by sorted name, "
            f"every second one to test: {', '.join(alphabets[1::2])}; "
            f"train: {', '.join(alphabets[0::2])}"
        )
    keys = [f"{a}/{c}" for a, c, _ in unique]
    return split_by_class(
        spec,
        list(unique.values()),
        keys,
        lambda k: k.split("/")[0] in train_alphabets,
        RECALL_K_SMALL,
        mode="L",
        notes=notes,
        groups=[a for a, _, _ in unique],
        sources=[drawer(name) for _, _, name in unique],
    )


def drawer(file_name: str) -> str:
    """The drawer of an Omniglot drawing from its file name: `0965_05.png` -> `05` (the whole stem if no `_`)."""
    stem = file_name.rsplit(".", 1)[0]
    return stem.rsplit("_", 1)[-1]
