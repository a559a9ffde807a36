"""Image folders and helpers shared by the gallery indexing tests (real files, real LMDB, real faiss)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from metricsearch.data import load_split


def unique_digits(split: str = "test", per_class: int | None = None) -> list[tuple[np.ndarray, str]]:
    """(8x8 uint8 image, class name) of the digits split, exact duplicates dropped, up to per_class each."""
    part = getattr(load_split("digits"), split)
    seen, out, counts = set(), [], {}
    for item, label in zip(part.items, part.labels):
        name = part.class_names[label]
        key = np.asarray(item).tobytes()
        if key in seen or (per_class is not None and counts.get(name, 0) >= per_class):
            continue
        seen.add(key)
        counts[name] = counts.get(name, 0) + 1
        out.append((np.asarray(item, dtype=np.uint8), name))
    return out


def write_class_folder(root: Path, digits: list[tuple[np.ndarray, str]]) -> Path:
    """root/<class>/<i>.png for each digit; returns root."""
    for i, (array, name) in enumerate(digits):
        (root / name).mkdir(parents=True, exist_ok=True)
        Image.fromarray(array, "L").save(root / name / f"{i:05d}.png")
    return root


def write_flat_folder(root: Path, n: int, size: int = 16) -> Path:
    """n distinct gray PNGs (upscaled digits with a unique corner pattern) directly in root."""
    root.mkdir(parents=True, exist_ok=True)
    digits = unique_digits("train") + unique_digits("test")
    for i in range(n):
        array = np.kron(digits[i % len(digits)][0], np.ones((size // 8, size // 8), np.uint8))
        array[0, :2] = (i // 256, i % 256)
        Image.fromarray(array, "L").save(root / f"{i:05d}.png")
    return root


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m metricsearch ARGS` in a subprocess (same environment)."""
    return subprocess.run([sys.executable, "-m", "metricsearch", *args], capture_output=True, text=True,
                          timeout=timeout, env=os.environ.copy())


def cli_popen(*args: str) -> subprocess.Popen:
    """`python -m metricsearch ARGS` started in the background."""
    return subprocess.Popen([sys.executable, "-m", "metricsearch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy())


def killed_at_batch(db: Path, args: Sequence[str], batch: int) -> dict:
    """Run `python -m metricsearch ARGS` until it SIGKILLs itself right after committing its `batch`-th batch
    (workers/kill_at_step.py: no race with the clock); the gallery's job state then."""
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("workers") / "kill_at_step.py"),
                           f"batch:{batch}", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == -9, (done.returncode, done.stderr)
    return job_state(db)


def job_state(db: Path) -> dict:
    """The gallery's job counters, state and version, read through a read-only LMDB handle."""
    from metricsearch.index.lmdb_store import Store

    try:
        store = Store.open(db)
    except FileNotFoundError:
        return {}
    try:
        with store.read() as txn:
            return {"job": store.meta(txn, "job") or {}, "state": store.meta(txn, "state"),
                    "version": store.version(txn), "count": store.count(txn)}
    finally:
        store.close()


def report(db: Path) -> dict:
    """DIR/report.json."""
    return json.loads((db / "report.json").read_text())


def one_line(err: str) -> str:
    """A command's stderr, asserted to be one line and no traceback."""
    err = err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err
