"""`Gallery.open(DIR)`: a built gallery, opened once and searched from many threads.

The faiss index is loaded from its newest file and brought up to the LMDB's committed version
by replaying the change log. Writes through this object update it at once; a search checks the
LMDB's version (at most once a millisecond) and catches up when another process has committed.
A search runs on one (faiss index, catalog) pair of one version, under a shared lock that changes
take exclusively: it sees a batch whole or not at all.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import faiss
import lmdb
import numpy as np

from metricsearch.models import OnnxEmbedder, select_providers

from .autoindex import candidate_lines
from .catalog import Catalog, SearchResults
from .faiss_files import UnusableIndex, index_bytes, save_index
from .faiss_index import select_device
from .layout import FORMAT_VERSION, Store, id_key, reporting_damage
from .locks import job_lock
from .state import IndexState, Newer
from .pipeline import ReadSettings, decode, normalized, read_bytes

log = logging.getLogger("metricsearch.index")
LOG_KEEP = 10_000  # commits of change log kept behind the faiss file, for readers that lag
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


class Gallery:
    """A searchable gallery: `search`, `thumbnail`, `info`, `labels`; and, opened writable,
    `add`, `remove`, `rebuild`. Thread-safe; use as a context manager or call `close()`."""

    def __init__(self, db: Path, store: Store, model: str | Path | None = None, device: str = "auto") -> None:
        self.db, self.store = Path(db), store
        with store.read() as txn:
            fmt, state = store.meta(txn, "format"), store.meta(txn, "state")
            self.model_info, self.settings = store.meta(txn, "model"), store.meta(txn, "settings", {})
            count = store.count(txn)
        if fmt is None:
            raise ValueError(f"{db} is not a finished gallery (no metadata): build it with `metricsearch index build`")
        if fmt > FORMAT_VERSION:
            raise ValueError(f"{db} has gallery format {fmt}; this metricsearch reads up to {FORMAT_VERSION}: upgrade it")
        if state != "ready":
            raise ValueError(f"{db}: its build did not finish ({count} images stored, no faiss index yet); "
                             "run the same `metricsearch index build` command with --resume")
        self.dim = int(self.model_info["dim"])
        self.model_path = Path(model) if model is not None else self.db / self.model_info["file"]
        if model is not None:
            check_model(self.model_info, model)
        self.device = device
        self.faiss_device = select_device(device)
        log.info("gallery %s: faiss on %s", db, self.faiss_device)
        self._embedder: OnnxEmbedder | None = None
        self._embedder_lock = threading.Lock()
        self._state: IndexState | None = None
        self._checked_at = -1.0
        try:
            self.refresh()
        except UnusableIndex as exc:
            if not store.writable:
                raise
            log.warning("%s; rebuilding it from the stored embeddings now", str(exc).split(": run ")[0])
            self.rebuild()

    @classmethod
    def open(cls, db: str | Path, *, model: str | Path | None = None, device: str = "auto",
             writable: bool = False) -> Gallery:
        """Open a gallery folder; `writable` for add/remove/rebuild (takes the gallery's writer lock),
        `model` checks that an ONNX file is the gallery's model and embeds queries with it."""
        db = Path(db)
        lock = job_lock(db) if writable else None
        if lock is not None:
            lock.__enter__()
        store = None
        try:
            store = Store.open(db, writable)
            gallery = cls(db, store, model, device)
        except BaseException:
            if store is not None:
                store.close()
            if lock is not None:
                lock.__exit__(None, None, None)
            raise
        gallery._lock = lock
        return gallery

    def close(self) -> None:
        """Release the LMDB environment and, if held, the writer lock."""
        self.store.close()
        lock, self._lock = getattr(self, "_lock", None), None
        if lock is not None:
            lock.__exit__(None, None, None)

    def __enter__(self) -> Gallery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- keeping the faiss index at the committed version ---------------------------------------

    def refresh(self) -> None:
        """Bring the in-memory index and catalog up to the latest committed write."""
        for _ in range(5):
            with self.store.lock.writing(), reporting_damage(self.db):
                try:
                    txn = self.store.env.begin()
                except lmdb.MapResizedError:  # another process grew the map: adopt its size
                    self.store.env.set_mapsize(0)
                    txn = self.store.env.begin()
                try:
                    if self._state is None:
                        self._state = IndexState.load(self.db, self.store, txn, self.model_info, self.faiss_device)
                    else:
                        self._state = self._state.advance(self.db, self.store, txn, self.model_info)
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
        lock = self.store.lock
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
            txn = self.store.begin()
            current = self.store.version(txn) == state.version
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
        return normalized(embedder.embed_arrays(np.stack(pixels)))

    # --- items ----------------------------------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        """The ids, labels and paths of the items at the version searches see now."""
        return self._state.catalog

    @property
    def exact(self) -> bool:
        """Whether the index searches exactly (flat) rather than approximately."""
        return bool(self._state.info["exact"])

    def __len__(self) -> int:
        return len(self._state.catalog)

    def labels(self) -> list[str]:
        """The labels the items carry, sorted."""
        return self._state.catalog.labels()

    def item(self, item_id: int) -> dict:
        """An item's id, path, label, sha256 and byte size (KeyError if there is no such item)."""
        with self.store.read() as txn:
            record = self.store.item(txn, int(item_id))
        if record is None:
            raise KeyError(f"no item {item_id} in {self.db}")
        return {"id": int(item_id), "path": record.path, "label": record.label, "sha256": record.sha256.hex(),
                "size": record.size}

    def thumbnail(self, item_id: int) -> bytes:
        """An item's thumbnail (JPEG or PNG bytes; b"" when the gallery keeps none)."""
        with self.store.read() as txn:
            data = txn.get(id_key(int(item_id)), db=self.store.dbs["thumbnails"])
            if data is None and self.store.item(txn, int(item_id)) is None:
                raise KeyError(f"no item {item_id} in {self.db}")
        return bytes(data or b"")

    def info(self) -> dict:
        """Model, dimension, count, index type and its search parameters, device, size on disk."""
        with self.store.read() as txn:
            job = self.store.meta(txn, "job")
        state = self._state
        lmdb_bytes, faiss_bytes = self.store.used_bytes(), index_bytes(self.db)
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
            "search_params": dict(state.header["params"]), "tuning": state.header.get("tuning", {}),
            "index_reason": state.header.get("reason"), "index_candidates": candidate_lines(state.header.get("choice", {})),
            "removed_pending_rebuild": int(len(state.tombstones)), "version": state.version,
            "device": {"faiss": self.faiss_device, "onnxruntime": providers[0]},
            "thumbnail_size": self.settings.get("thumbnail_size"), "last_job": job,
            "size_bytes": {"lmdb": lmdb_bytes, "faiss": faiss_bytes, "model": model_bytes,
                           "total": lmdb_bytes + faiss_bytes + model_bytes},
        }

    # --- changing the gallery (opened writable) -------------------------------------------------

    def checkpoint(self) -> Path:
        """Save the in-memory index as the faiss file of the current version; trim the change log."""
        from .writer import bump_version

        self.store.lock.acquire_read()
        try:
            state = self._state
            version = state.version
            header = dict(state.header, version=version, generation=state.generation, count=len(state.catalog))
            path = save_index(self.db, state.index, header)
        finally:
            self.store.lock.release_read()

        def trim(txn: lmdb.Transaction) -> None:
            self.store.prune_log(txn, version - LOG_KEEP)
            bump_version(self.store, txn)

        self.store.write(trim)
        return path

    def add(self, images: str, **options: Any):
        """Index the images of a data set spec into this gallery (see `add_images`); returns a JobSummary."""
        from .jobs import run_add

        return run_add(self, images, **options)

    def remove(self, ids: Sequence[int] | None = None, label: str | None = None) -> np.ndarray:
        """Remove items by id or by label; returns the ids removed (ValueError for unknown ones)."""
        from .writer import GalleryWriter

        if (ids is None) == (label is None):
            raise ValueError("remove takes ids or a label (one of the two)")
        catalog = self._state.catalog
        targets = catalog.label_ids(label) if label is not None else np.asarray(list(ids), dtype=np.int64)
        unknown = np.setdiff1d(targets, catalog.ids)
        if len(unknown):
            raise ValueError(f"no item with id {', '.join(map(str, unknown[:10]))} in {self.db}; nothing removed")
        removed = GalleryWriter(self.store).remove(targets, tombstones=not self._state.info["removable"])
        self.refresh()
        self.checkpoint()
        return removed

    def rebuild(self, index: str | None = None) -> dict:
        """Build the faiss index again from the stored embeddings (removed ids dropped; `index`: a new type)."""
        from .jobs import build_faiss

        header = build_faiss(self.store, self.db, index, self.faiss_device)
        self.refresh()  # the new generation: loaded from the new file
        return header
