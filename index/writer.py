"""Stage 3, the single writer: each batch in one LMDB transaction (items, embeddings, thumbnails, their
checksums, hashes, sources, failures, the change log and the counters), and removals the same way."""

from __future__ import annotations

import time

import lmdb
import numpy as np

from .lmdb_store import ADD, REMOVE, ItemRecord, Store, checksums, id_key
from .pipeline import ReadItem


def bump_version(store: Store, txn: lmdb.Transaction) -> int:
    """Count one more committed write; returns its version."""
    version = store.version(txn) + 1
    store.put_meta(txn, "version", version)
    return version


def record_job(store: Store, txn: lmdb.Transaction, command: str, images: str | None, part: str | None,
               resume: bool) -> dict:
    """In `txn`: record the job that starts (its failures list cleared), or keep the interrupted one on resume."""
    job = store.meta(txn, "job")
    if resume and job is not None:
        job["resumed"] = job.get("resumed", 0) + 1
    else:
        txn.drop(store.dbs["failures"], delete=False)
        job = {"command": command, "images": images, "part": part, "indexed": 0, "duplicates": 0,
               "failed": 0, "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "resumed": 0}
    store.put_meta(txn, "job", job)
    bump_version(store, txn)
    return job


def job_record(command: str, **details) -> dict:
    """The `job` metadata of a change made without images (remove, rebuild), started now."""
    return {"command": command, **details, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}


def start_job(store: Store, command: str, images: str | None, part: str | None, resume: bool) -> dict:
    """Record the job that starts (its failures list cleared), or keep the interrupted one on resume."""
    return store.write(lambda txn: record_job(store, txn, command, images, part, resume))


class GalleryWriter:
    """Writes read and embedded batches, and removals, to a gallery's LMDB."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def committed(self, sha256: bytes) -> bool:
        """Whether an image with this sha256 is in the gallery (committed)."""
        with self.store.read() as txn:
            return txn.get(sha256, db=self.store.dbs["hashes"]) is not None

    def write_batch(self, items: list[ReadItem], vectors: np.ndarray | None) -> np.ndarray:
        """Commit one batch: new items get the next ids; duplicates map their source onto the item they
        repeat; failures are listed with their reason. Returns the new ids."""
        s, dbs = self.store, self.store.dbs

        def fn(txn: lmdb.Transaction) -> np.ndarray:
            next_id, job = s.meta(txn, "next_id", 0), s.meta(txn, "job", {})
            added, row = [], 0
            for it in items:
                source = it.source.encode()
                if it.status == "failed":
                    txn.put(source, it.reason.encode(), db=dbs["failures"])
                    job["failed"] = job.get("failed", 0) + 1
                    continue
                vector = None
                if it.status == "ok":
                    vector, row = vectors[row], row + 1
                original = txn.get(it.sha256, db=dbs["hashes"])
                if it.status == "duplicate" or original is not None:
                    if original is not None:
                        txn.put(source, original, db=dbs["sources"])
                    job["duplicates"] = job.get("duplicates", 0) + 1
                    continue
                key = id_key(next_id)
                record = ItemRecord(it.source, it.label, it.sha256, it.size).encode()
                vector = np.asarray(vector, dtype="<f4").tobytes()
                txn.put(key, record, db=dbs["items"])
                txn.put(key, vector, db=dbs["embeddings"])
                if it.thumbnail:
                    txn.put(key, it.thumbnail, db=dbs["thumbnails"])
                txn.put(key, checksums(record, vector, it.thumbnail), db=dbs["checksums"])
                txn.put(it.sha256, key, db=dbs["hashes"])
                txn.put(source, key, db=dbs["sources"])
                added.append(next_id)
                next_id += 1
            job["indexed"] = job.get("indexed", 0) + len(added)
            version = bump_version(s, txn)
            if added:
                s.append_log(txn, version, ADD, np.array(added, np.int64))
            s.put_meta(txn, "next_id", next_id)
            s.put_meta(txn, "job", job)
            return np.array(added, np.int64)

        return s.write(fn)

    def remove(self, ids: np.ndarray, tombstones: bool, job: dict) -> np.ndarray:
        """Delete items (record, embedding, thumbnail, hash, sources) in one transaction and log it, with
        `job` (plus the count removed) as the last job; `tombstones` also lists the ids for an index faiss
        cannot remove from. Returns the removed ids."""
        s, dbs = self.store, self.store.dbs

        def fn(txn: lmdb.Transaction) -> np.ndarray:
            gone: list[int] = []
            for i in np.unique(np.asarray(ids, dtype=np.int64)):
                record = s.item(txn, int(i))
                if record is None:
                    continue
                key = id_key(int(i))
                for name in ("items", "embeddings", "thumbnails", "checksums"):
                    txn.delete(key, db=dbs[name])
                if txn.get(record.sha256, db=dbs["hashes"]) == key:
                    txn.delete(record.sha256, db=dbs["hashes"])
                if tombstones:
                    txn.put(key, b"", db=dbs["tombstones"])
                gone.append(int(i))
            keys = {id_key(i) for i in gone}
            cursor = txn.cursor(db=dbs["sources"])
            more = cursor.first()
            while more:  # a deleting cursor moves to the next entry, or off the end
                if cursor.value() in keys:
                    cursor.delete()
                    more = bool(cursor.key())
                else:
                    more = cursor.next()
            version = bump_version(s, txn)
            if gone:
                s.append_log(txn, version, REMOVE, np.array(gone, np.int64))
            s.put_meta(txn, "job", {**job, "removed": len(gone)})
            return np.array(gone, np.int64)

        return s.write(fn)
