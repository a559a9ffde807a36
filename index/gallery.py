"""`Gallery.open(DIR)`: a built gallery, opened once and searched from many threads (the search
side only: every change is a job of `jobs.py`, which holds the writer lock).

The faiss index is loaded from its newest file and brought up to the LMDB's committed version
by replaying the change log. A search checks the LMDB's version (at most once a millisecond) and
catches up when a job of this or another process has committed; `refresh()` catches up at once.
A search runs on one (faiss index, catalog) pair of one version, under a shared lock that changes
take exclusively: it sees a batch whole or not at all.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import faiss
import lmdb
import numpy as np

from metricsearch.models import OnnxEmbedder, select_providers

from .autoindex import candidate_lines, current_reason
from .catalog import Catalog, SearchResults
from .faiss_files import index_bytes
from .faiss_index import MEMORY_FRACTION, available_memory, select_device
from .lmdb_store import FORMAT_VERSION, Store, id_key, reporting_damage
from .state import IndexState, Newer
from .pipeline import ReadSettings, decode, normalized, read_bytes

log = logging.getLogger("metricsearch.index")
RECHECK_S = 0.001  # a search checks the LMDB for other processes' commits at most this often


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file: a model's fingerprint."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_model(meta_model: dict, path: str | Path, dim: int | None = None) -> None:
    """ValueError unless the ONNX file at `path` is the gallery's model (same sha256 and dimension)."""
    fingerprint = file_sha256(path)
    if fingerprint != meta_model["fingerprint"] or (dim is not None and dim != meta_model["dim"]):
        raise ValueError(
            f"model {path} is not the gallery's model: its fingerprint is {fingerprint[:12]} "
            f"({dim or '?'}-d), the gallery was built with {meta_model['fingerprint'][:12]} "
            f"({meta_model['dim']}-d, from {meta_model['source']}); its embeddings are not comparable"
        )


def finished(db: Path, store: Store) -> tuple[dict, dict]:
    """(model, read settings) of a finished gallery; ValueError for no metadata, a newer format, or a build that
    did not finish (which only `index build --resume` finishes: its images are not all in)."""
    with store.read() as txn:
        fmt, state = store.meta(txn, "format"), store.meta(txn, "state")
        model, settings, count = store.meta(txn, "model"), store.meta(txn, "settings", {}), store.count(txn)
    if fmt is None:
        raise ValueError(f"{db} is not a finished gallery (no metadata): build it with `metricsearch index build`")
    if fmt > FORMAT_VERSION:
        raise ValueError(f"{db} has gallery format {fmt}; this metricsearch reads up to {FORMAT_VERSION}: upgrade it")
    if state != "ready":
        raise ValueError(f"{db}: its build did not finish ({count} images stored, no faiss index yet); finish it "
                         "with the same `metricsearch index build` command and --resume")
    return model, settings


class Gallery:
    """A searchable gallery: `search`, `embed`, `thumbnail`, `item`, `info`, `labels`, `vectors`.
    Thread-safe; use as a context manager or call `close()`.

    `Gallery(db, store)` searches over a store the caller holds open (a job's writable one);
    `Gallery.open(db)` opens its own, read-only. `mmap` memory-maps the faiss index from its file instead
    of loading it (read-only: changes committed since are searched beside it, removals filtered).
    UnusableIndex when the faiss file cannot serve."""

    def __init__(self, db: Path, store: Store, model: str | Path | None = None, device: str = "auto",
                 mmap: bool = False) -> None:
        self.db, self._store = Path(db), store
        self._resources = ExitStack()  # what close() releases: what `open` opened for this gallery
        self.model_info, self.settings = finished(db, store)
        self.dim = int(self.model_info["dim"])
        self.model_path = Path(model) if model is not None else self.db / self.model_info["file"]
        if model is not None:
            check_model(self.model_info, model)
        self.device, self.mmap = device, mmap
        self.faiss_device = select_device(device)
        log.info("gallery %s: faiss on %s", db, self.faiss_device)
        self._embedder: OnnxEmbedder | None = None
        self._embedder_lock = threading.Lock()
        self._state: IndexState | None = None
        self._checked_at = -1.0
        self.refresh()

    @classmethod
    def open(cls, db: str | Path, *, model: str | Path | None = None, device: str = "auto",
             mmap: bool | None = None) -> Gallery:
        """Open a gallery folder read-only for searching; `model` checks that an ONNX file is the
        gallery's model and embeds queries with it; `mmap` memory-maps the faiss index from its file
        instead of loading it (None: when the file is larger than half the memory available)."""
        if mmap is None:
            mmap = index_bytes(Path(db)) > MEMORY_FRACTION * available_memory()
        with ExitStack() as stack:
            store = stack.enter_context(Store.opened(Path(db)))
            gallery = cls(db, store, model, device, mmap)
            gallery._resources = stack.pop_all()
        return gallery

    def close(self) -> None:
        """Release what `open` opened (the LMDB environment)."""
        self._resources.close()

    def __enter__(self) -> Gallery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- keeping the faiss index at the committed version ---------------------------------------

    def refresh(self) -> None:
        """Bring the in-memory index and catalog up to the latest committed write."""
        for _ in range(5):
            with self._store.lock.writing(), reporting_damage(self.db):
                try:
                    txn = self._store.env.begin()
                except lmdb.MapResizedError:  # another process grew the map: adopt its size
                    self._store.env.set_mapsize(0)
                    txn = self._store.env.begin()
                try:
                    if self._state is None:
                        self._state = IndexState.load(self.db, self._store, txn, self.model_info, self.faiss_device,
                                                      self.mmap)
                    else:
                        self._state = self._state.advance(self.db, self._store, txn, self.model_info)
                    self._checked_at = time.monotonic()
                    return
                except Newer:
                    continue
                finally:
                    txn.abort()
        raise OSError(f"{self.db}: the faiss index keeps changing under this reader; try again")

    # --- searching ------------------------------------------------------------------------------

    def search(self, queries: Any, k: int = 10, label: str | None = None) -> SearchResults:
        """The k nearest items of each query, nearest first (optionally only items labelled `label`):
        one Hits per query, in order; k above the gallery's item count is capped to it.

        `queries`: an N x dim float array of vectors (one vector: 1 x dim), or images (a path,
        bytes, PIL image or uint8 array, or a list of them) embedded with the gallery's model."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        x = self._query_vectors(queries)
        lock = self._store.lock
        while True:
            lock.acquire_read()
            try:
                state = self._state
                if time.monotonic() - self._checked_at < RECHECK_S or self._current(state):
                    return state.search(x, k, label)
            finally:
                lock.release_read()
            self.refresh()

    def _current(self, state: IndexState) -> bool:
        """Whether `state` is still the LMDB's committed version (no other process has written since)."""
        now = time.monotonic()
        with reporting_damage(self.db):
            txn = self._store.begin()
            current = self._store.version(txn) == state.version
            txn.abort()
        if current:
            self._checked_at = now
        return current

    def _query_vectors(self, queries: Any) -> np.ndarray:
        if isinstance(queries, np.ndarray) and queries.dtype.kind == "f":
            x = np.array(queries, dtype=np.float32, ndmin=2, order="C")
        else:
            x = self.embed(list(queries) if isinstance(queries, (list, tuple)) else [queries])
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"query vectors of shape {x.shape} do not match the gallery's {self.dim}-d embeddings "
                             "(vectors from another model?)")
        faiss.normalize_L2(x)
        return x

    @property
    def embedder(self) -> OnnxEmbedder:
        """The gallery's model (or the checked one given to open), loaded on first use."""
        with self._embedder_lock:
            if self._embedder is None:
                self._embedder = OnnxEmbedder(self.model_path, self.device)
            return self._embedder

    def embed(self, images: Sequence[Any]) -> np.ndarray:
        """Unit-length embeddings of query images, loaded exactly as the indexer loads gallery images."""
        embedder = self.embedder
        pre = embedder.preprocessing
        settings = ReadSettings(**{**self.settings, "mode": None})
        pixels = []
        for source in images:
            is_path = isinstance(source, (str, Path))
            data = read_bytes(source, settings.max_bytes) if is_path else source
            pixels.append(pre(decode(data, settings, pre, str(source) if is_path else "query image")))
        return self.embed_pixels(np.stack(pixels))

    def embed_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """Unit-length embeddings of a batch already preprocessed for the gallery's model."""
        return normalized(self.embedder.embed_arrays(pixels))

    # --- items ----------------------------------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        """The ids, labels and paths of the items at the version searches see now."""
        return self._state.catalog

    @contextmanager
    def snapshot(self) -> Iterator[IndexState]:
        """The searchable state of the version searches see now, kept from changing during the block."""
        self._store.lock.acquire_read()
        try:
            yield self._state
        finally:
            self._store.lock.release_read()

    def vectors(self, ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, N x dim float32 embeddings) of the items `ids` (default: every item), in id order."""
        with self._store.read() as txn:
            return self._store.vectors(txn, ids)

    @property
    def removable(self) -> bool:
        """Whether faiss can remove ids from the index (else removed ids wait, filtered, for a rebuild)."""
        return bool(self._state.info["removable"])

    @property
    def exact(self) -> bool:
        """Whether the index searches exactly (flat) rather than approximately."""
        return bool(self._state.info["exact"])

    def __len__(self) -> int:
        return len(self._state.catalog)

    def labels(self) -> list[str]:
        """The labels the items carry, sorted."""
        return self._state.catalog.labels()

    def _id(self, item_id: int) -> int:
        """`item_id` as an int; KeyError for one no item can have (ids are 0 to 2**64 - 1), as for an absent one."""
        if not 0 <= int(item_id) < 1 << 64:
            raise KeyError(f"no item {item_id} in {self.db}")
        return int(item_id)

    def item(self, item_id: int) -> dict:
        """An item's id, path, label, sha256 and byte size (KeyError if there is no such item)."""
        with self._store.read() as txn:
            record = self._store.item(txn, self._id(item_id))
        if record is None:
            raise KeyError(f"no item {item_id} in {self.db}")
        return {"id": int(item_id), "path": record.path, "label": record.label, "sha256": record.sha256.hex(),
                "size": record.size}

    def thumbnail(self, item_id: int) -> bytes:
        """An item's thumbnail (JPEG or PNG bytes; b"" when the gallery keeps none); KeyError for no such item."""
        item_id = self._id(item_id)
        with self._store.read() as txn:
            data = txn.get(id_key(item_id), db=self._store.dbs["thumbnails"])
            if data is None and self._store.item(txn, item_id) is None:
                raise KeyError(f"no item {item_id} in {self.db}")
        return bytes(data or b"")

    def info(self) -> dict:
        """Model, dimension, count, index type and its search parameters, device, size on disk."""
        with self._store.read() as txn:
            job = self._store.meta(txn, "job")
        state = self._state
        lmdb_bytes, faiss_bytes = self._store.used_bytes(), index_bytes(self.db)
        model_bytes = self.model_path.stat().st_size if self.model_path.is_file() else 0
        if self._embedder is not None:
            providers = self._embedder.providers
        else:
            import onnxruntime

            providers = select_providers(onnxruntime.get_available_providers(), self.device)
        return {
            "db": str(self.db), "model": self.model_info["source"], "fingerprint": self.model_info["fingerprint"],
            "dim": self.dim, "count": len(self), "labels": len(self.labels()),
            "index_type": state.header["factory"], "index_kind": state.info["kind"], "exact": state.info["exact"],
            "index_mmap": state.mapped, "rerank": state.rerank,
            "search_params": dict(state.header["params"]), "tuning": state.header.get("tuning", {}),
            "index_reason": current_reason(state.header, len(self)),
            "index_candidates": candidate_lines(state.header.get("choice", {})),
            "removed_pending_rebuild": int(len(state.tombstones)), "version": state.version,
            "device": {"faiss": self.faiss_device, "onnxruntime": providers[0]},
            "thumbnail_size": self.settings.get("thumbnail_size"), "last_job": job,
            "size_bytes": {"lmdb": lmdb_bytes, "faiss": faiss_bytes, "model": model_bytes,
                           "total": lmdb_bytes + faiss_bytes + model_bytes},
        }
