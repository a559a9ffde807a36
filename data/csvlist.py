"""`csv:FILE`: a CSV with a `path` column and an optional `label` column; relative paths start at
the CSV's folder. The files are not opened here: the indexer reports the ones it cannot read."""

from __future__ import annotations

import csv
from pathlib import Path

from .base import ImageSet, image_set


def load_set(file: Path) -> ImageSet:
    """The images a CSV lists, labelled by its `label` column (an empty or absent label: none)."""
    if not file.is_file():
        raise FileNotFoundError(f"csv:{file}: file {file} does not exist")
    try:
        with open(file, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"csv:{file}: not a readable UTF-8 CSV file ({exc})") from exc
    if not rows:
        raise ValueError(f"csv:{file}: the file is empty; expected a header row with `path` (and `label`)")
    header = [h.strip().lower() for h in rows[0]]
    if "path" not in header:
        raise ValueError(f"csv:{file}: no `path` column in the header row (found: {', '.join(header) or 'nothing'})")
    col_path, col_label = header.index("path"), header.index("label") if "label" in header else None
    paths: list[Path] = []
    keys: list[str | None] = []
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        raw = row[col_path].strip() if col_path < len(row) else ""
        if not raw:
            raise ValueError(f"csv:{file}: line {line} has an empty path")
        path = Path(raw).expanduser()
        paths.append(path if path.is_absolute() else file.parent / path)
        label = row[col_label].strip() if col_label is not None and col_label < len(row) else ""
        keys.append(label or None)
    if not paths:
        raise ValueError(f"csv:{file}: the file lists no images")
    return image_set(paths, keys)
