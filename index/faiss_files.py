"""The faiss index on disk, beside the LMDB: `DIR/index/<version>-<generation>.faiss` with a JSON
header of the same name. A file is written to a temporary name, synced and renamed, its header
last; readers take the newest complete pair. The version in the name is the LMDB write the index
reflects: the LMDB change log after it brings the index up to date (after SIGKILL too)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import faiss

from .build_steps import reached
from .faiss_index import INDEX_DIR


class UnusableIndex(ValueError):
    """The gallery's faiss index is missing, damaged or does not fit its LMDB: rebuild it from the embeddings."""


def _sync_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _pairs(folder: Path) -> list[tuple[tuple[int, int], Path]]:
    """(version, generation) and header path of each complete file pair, newest first."""
    found = []
    for header in folder.glob("*.json"):
        try:
            version, generation = (int(x) for x in header.stem.split("-"))
        except ValueError:
            continue
        if header.with_suffix(".faiss").is_file():
            found.append(((version, generation), header))
    return sorted(found, reverse=True)


def save_index(db: Path, index: faiss.Index, header: dict) -> Path:
    """Write `index` (a CPU index) with `header` (holding version and generation); older files go."""
    folder = Path(db) / INDEX_DIR
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{int(header['version']):012d}-{int(header['generation']):06d}"
    path = folder / f"{stem}.faiss"
    _sync_write(path, lambda p: faiss.write_index(index, str(p)))
    reached("faiss_file")
    _sync_write(folder / f"{stem}.json", lambda p: p.write_text(json.dumps(header, indent=1, sort_keys=True)))
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    keep = (int(header["version"]), int(header["generation"]))
    for key, old in _pairs(folder):
        if key != keep:
            old.unlink(missing_ok=True)
            old.with_suffix(".faiss").unlink(missing_ok=True)
    for stale in [*folder.glob("*.tmp"), *folder.glob("*.faiss")]:  # and a file whose header was never written
        if stale != path:
            stale.unlink(missing_ok=True)
    return path


def load_index(db: Path, mmap: bool = False) -> tuple[faiss.Index, dict] | None:
    """The newest saved index and its header, None when there is none; with `mmap`, the index is memory-mapped
    from its file (faiss.IO_FLAG_MMAP_IFC: codes and inverted lists stay on disk, read as searches touch them)
    instead of loaded, and must not be changed (faiss aborts the process)."""
    folder = Path(db) / INDEX_DIR
    for _ in range(5):  # a writer may replace the files between listing and reading: list again
        pairs = _pairs(folder) if folder.is_dir() else []
        if not pairs:
            return None
        _, header_path = pairs[0]
        path = header_path
        try:
            header = json.loads(header_path.read_text())
            if not isinstance(header, dict):
                raise ValueError("not a JSON object")
            path = header_path.with_suffix(".faiss")
            return faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC if mmap else 0), header
        except FileNotFoundError:
            continue
        except (ValueError, RuntimeError) as exc:  # JSON or faiss cannot read it: damaged, unless replaced meanwhile
            if _pairs(folder)[:1] == pairs[:1]:
                detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                raise UnusableIndex(f"{path} is damaged ({detail}): run `metricsearch index rebuild --db {db}`") \
                    from exc
    raise OSError(f"cannot read the faiss index in {folder}: its files keep changing; try again")


def index_bytes(db: Path) -> int:
    """Bytes of the newest saved faiss file (0 when none)."""
    pairs = _pairs(Path(db) / INDEX_DIR) if (Path(db) / INDEX_DIR).is_dir() else []
    return pairs[0][1].with_suffix(".faiss").stat().st_size if pairs else 0
