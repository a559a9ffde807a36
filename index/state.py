"""A gallery's searchable state at one committed LMDB version: the faiss index (and its GPU replica),
its description and tuned parameters, the removed ids an index cannot drop, and the catalog.
It is loaded from the newest faiss file and moved forward by replaying the LMDB change log; the
caller holds the store's lock exclusively while it changes, shared while it searches.

An index of lossy codes (PQ, SQ) re-ranks its shortlist with the float vectors read from the LMDB
(`faiss_index.reranked`). A memory-mapped index (`mmap`) is read-only: items added since its file are
searched exactly in a small index beside it, and removed ones are filtered at search time."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import faiss
import lmdb
import numpy as np

from .catalog import Catalog, SearchResults
from .faiss_files import UnusableIndex, load_index
from .faiss_index import describe, make_index, rescored, search_params, set_param, shortlist, to_device
from .lmdb_store import ADD, Store, id_key, reporting_damage


class Newer(Exception):
    """The faiss file on disk is newer than the transaction in hand: take a fresh one."""


def net_changes(changes: list[tuple[bytes, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(added, removed) over a run of log entries: ids added then removed cancel (ids are never reused)."""
    empty = np.zeros(0, np.int64)
    added = np.concatenate([ids for op, ids in changes if op == ADD] or [empty])
    removed = np.concatenate([ids for op, ids in changes if op != ADD] or [empty])
    return np.setdiff1d(added, removed), np.setdiff1d(removed, added)


def stored_vectors(db: Path, store: Store, dim: int) -> Callable[[np.ndarray], np.ndarray]:
    """The float vectors of given ids, read from the gallery's LMDB (the caller holds the store's lock shared);
    NaN for an id another process removed meanwhile (`rescored` drops it)."""
    def fetch(ids: np.ndarray) -> np.ndarray:
        out = np.full((len(ids), dim), np.nan, np.float32)
        with reporting_damage(db):
            txn = store.begin()
            try:
                for row, i in enumerate(ids.tolist()):
                    value = txn.get(id_key(i), db=store.dbs["embeddings"])
                    if value is not None:
                        out[row] = np.frombuffer(value, np.float32)
            finally:
                txn.abort()
        return out
    return fetch


def merged(first: tuple[np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray],
           k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (highest score) of two searches' (scores, ids) for the same queries, per query."""
    scores, ids = np.hstack([first[0], second[0]]), np.hstack([first[1], second[1]])
    scores[ids < 0] = np.finfo(np.float32).min
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, top, 1), np.take_along_axis(ids, top, 1)


@dataclass
class IndexState:
    """The faiss index and catalog of one version; `search_index` is the device replica searches use."""

    index: faiss.Index
    search_index: faiss.Index
    info: dict
    header: dict
    tombstones: np.ndarray
    catalog: Catalog
    version: int
    generation: int
    device: str
    selectors: dict = field(default_factory=dict)
    fetch: Callable[[np.ndarray], np.ndarray] | None = None  # float vectors by id, for re-ranking
    mapped: bool = False  # the index is memory-mapped from its file (read-only)
    extra: faiss.Index | None = None  # a mapped index's additions since its file, searched exactly

    @property
    def rerank(self) -> int:
        """The shortlist factor of an index of lossy codes (`faiss_index.shortlist`); 0: no re-ranking."""
        return int(self.header.get("choice", {}).get("rerank", 0)) if self.fetch is not None else 0

    @classmethod
    def load(cls, db: Path, store: Store, txn: lmdb.Transaction, model: dict, device: str,
             mmap: bool = False) -> IndexState:
        """The newest faiss file (memory-mapped with `mmap`) brought up to the version of `txn` (Newer if the
        file is past it)."""
        version, generation = store.version(txn), store.meta(txn, "generation", 0)
        loaded = load_index(db, mmap)
        if loaded is None:
            raise UnusableIndex(f"{db} has no faiss index: run `metricsearch index rebuild --db {db}`")
        index, header = loaded
        if header["version"] > version:
            raise Newer
        if header["fingerprint"] != model["fingerprint"] or header["dim"] != model["dim"]:
            raise UnusableIndex(f"{db}: the faiss index was built for another model or dimension "
                             f"({header['dim']}-d); run `metricsearch index rebuild --db {db}`")
        changes = store.log_since(txn, header["version"], version)
        if changes is None:
            raise UnusableIndex(f"{db}: the faiss file (write {header['version']}) is older than the change log "
                             f"reaches; run `metricsearch index rebuild --db {db}`")
        for name, value in header["params"].items():
            set_param(index, name, value)
        info = describe(index)
        if mmap:  # faiss cannot change a mapped index: removals wait as tombstones
            info["removable"] = False
        state = cls(index, index if mmap else to_device(index, device), info, header, store.ids(txn, "tombstones"),
                    Catalog.of(store.records(txn)), version, generation, device,
                    fetch=stored_vectors(db, store, int(model["dim"])), mapped=mmap)
        state.apply(store, txn, changes, version, catalog_current=True)
        return state

    def advance(self, db: Path, store: Store, txn: lmdb.Transaction, model: dict) -> IndexState:
        """This state moved to the version of `txn` by the change log, or a fresh load when the log does
        not reach back far enough or the index was rebuilt."""
        version, generation = store.version(txn), store.meta(txn, "generation", 0)
        if version == self.version:
            return self
        changes = store.log_since(txn, self.version, version) if generation == self.generation else None
        if changes is None:
            return IndexState.load(db, store, txn, model, self.device, self.mapped)
        self.apply(store, txn, changes, version)
        return self

    def apply(self, store: Store, txn: lmdb.Transaction, changes: list, version: int,
              catalog_current: bool = False) -> None:
        """Apply log entries to the index (and, unless it is already current, to the catalog)."""
        added, removed = net_changes(changes)
        if len(removed) and self.info["removable"]:
            self.index.remove_ids(faiss.IDSelectorBatch(removed))
            if self.search_index is not self.index:
                self.search_index = to_device(self.index, self.device)
        elif len(removed):
            self.tombstones = np.union1d(self.tombstones, removed)
        if len(added):
            _, vectors = store.vectors(txn, added)
            if self.mapped:
                self.extra = self.extra or make_index("IDMap,Flat", vectors.shape[1])
                self.extra.add_with_ids(vectors, added)
            else:
                self.index.add_with_ids(vectors, added)
            if self.search_index is not self.index:
                self.search_index.add_with_ids(vectors, added)
        if not catalog_current:
            self.catalog = self.catalog.removed(removed).added(store.records(txn, added))
        self.version, self.selectors = version, {}

    def search(self, x: np.ndarray, k: int, label: str | None) -> SearchResults:
        """The k nearest of each query (k at most the item count), only `label` items when given, removed ids never."""
        k = min(k, max(1, len(self.catalog)))
        wanted, selector = shortlist(k, self.rerank) if self.rerank else k, None
        if label is None and not len(self.tombstones):  # the C++ call itself: x is a checked n x d float32 array
            scores, ids = np.empty((len(x), wanted), np.float32), np.empty((len(x), wanted), np.int64)
            self.search_index.search_c(len(x), faiss.swig_ptr(x), wanted, faiss.swig_ptr(scores),
                                       faiss.swig_ptr(ids))
        else:
            selector = self.selector(label)[0]
            scores, ids = self.index.search(x, wanted, params=search_params(self.info, self.header["params"], selector))
        if self.rerank:
            scores, ids = rescored(x, ids, self.fetch, k)
        if self.extra is not None:
            within = faiss.SearchParameters(sel=selector) if selector is not None else None
            scores, ids = merged((scores, ids), self.extra.search(x, k, params=within), k)
        return self.catalog.hits(scores, ids)

    def selector(self, label: str | None) -> tuple:
        """(faiss id selector, the selectors it points to) for a label filter and/or dead ids; cached."""
        cached = self.selectors.get(label)
        if cached is None:
            refs: list = []
            selector = None
            if label is not None:
                selector = faiss.IDSelectorBatch(self.catalog.label_ids(label))
                refs.append(selector)
            if len(self.tombstones):
                dead = faiss.IDSelectorBatch(self.tombstones)
                alive = faiss.IDSelectorNot(dead)
                refs += [dead, alive]
                selector = alive if selector is None else faiss.IDSelectorAnd(selector, alive)
            cached = self.selectors[label] = (selector, refs)
        return cached
