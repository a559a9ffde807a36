"""`index info` and `index verify`: what a gallery holds, and whether LMDB, faiss and the model agree."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .faiss_files import UnusableIndex, index_bytes, load_index
from .faiss_index import describe, index_ids
from .gallery import Gallery, file_sha256
from .lmdb_store import DamagedGallery, Store, key_id, mismatches
from .state import net_changes


def gallery_info(db: str | Path, device: str = "auto") -> dict:
    """Model, dimension, count, index type and search parameters, device, size on disk; for a build
    that has not finished, what the LMDB holds so far (state `building`, no index yet)."""
    store = Store.open(Path(db))
    try:
        with store.read() as txn:
            state, model, count = store.meta(txn, "state"), store.meta(txn, "model") or {}, store.count(txn)
            job = store.meta(txn, "job")
        if state == "ready":
            with Gallery.open(db, device=device) as gallery:
                return {"state": state, **gallery.info()}
        return {"state": state or "empty", "db": str(db), "model": model.get("source"), "dim": model.get("dim"),
                "count": count, "index_type": None, "search_params": {}, "last_job": job,
                "size_bytes": {"lmdb": store.used_bytes(), "faiss": index_bytes(Path(db))}}
    finally:
        store.close()


def _differ(a: np.ndarray, b: np.ndarray, what_a: str, what_b: str) -> list[str]:
    only_a, only_b = np.setdiff1d(a, b), np.setdiff1d(b, a)
    out = []
    for ids, x, y in ((only_a, what_a, what_b), (only_b, what_b, what_a)):
        if len(ids):
            out.append(f"{len(ids)} id(s) in {x} are not in {y} (e.g. {', '.join(map(str, ids[:5]))})")
    return out


def verify_gallery(db: str | Path) -> dict:
    """{"ok", "problems", "notes", "count", "faiss_count"}: the LMDB file is whole (`Store`'s checks before
    it is opened); LMDB items, embeddings, thumbnails and hashes agree, and match the checksums stored with
    them (galleries written before checksums: a note); the faiss index (brought up to date from the change
    log) holds exactly the items' ids (plus, for an index that cannot remove, the removed ones awaiting a
    rebuild); the model file is the one the gallery was built with."""
    db = Path(db)
    problems, notes = [], []
    try:
        store = Store.open(db)
    except DamagedGallery as exc:
        return {"ok": False, "problems": [str(exc)], "notes": [], "count": None, "faiss_count": None}
    try:
        for _ in range(5):  # a writer may save a newer faiss file meanwhile: look again
            try:
                with store.read() as txn:
                    report = _check(store, db, txn, problems, notes)
            except DamagedGallery as exc:
                problems.append(str(exc))
                report = {"count": None, "faiss_count": None}
            if report is not None:
                break
            problems.clear()
            notes.clear()
    finally:
        store.close()
    return {"ok": not problems, "problems": problems, "notes": notes, **(report or {})}


def _check_checksums(store: Store, txn, problems: list[str], notes: list[str]) -> None:
    """Each item's record, vector and thumbnail against the checksums stored with it (reads them all)."""
    if "checksums" not in store.dbs:
        notes.append("no checksums: this gallery was built before metricsearch stored them, so the bytes of its "
                     "thumbnails and vectors are not checked")
        return
    damaged, unchecked = [], 0
    dbs = store.dbs
    for key, record in txn.cursor(db=dbs["items"]):
        stored = txn.get(key, db=dbs["checksums"])
        if stored is None:
            unchecked += 1
            continue
        parts = mismatches(stored, record, txn.get(key, b"", db=dbs["embeddings"]),
                           txn.get(key, b"", db=dbs["thumbnails"]))
        if parts:
            damaged.append(f"item {key_id(key)} ({' and '.join(parts)})")
    if damaged:
        problems.append(f"{len(damaged)} item(s) do not match the checksums stored with them: "
                        f"{', '.join(damaged[:5])}; remove them with `metricsearch index remove --ids ...` and add "
                        "their images again, or restore the gallery folder from a backup")
    if unchecked:
        notes.append(f"{unchecked} item(s) have no checksums: added before metricsearch stored them")


def _check(store: Store, db: Path, txn, problems: list[str], notes: list[str]) -> dict | None:
    fmt, state, model = store.meta(txn, "format"), store.meta(txn, "state"), store.meta(txn, "model")
    version = store.version(txn)
    if fmt is None or model is None:
        problems.append("no gallery metadata: the build never got past its start")
        return {"count": store.count(txn), "faiss_count": None}
    if state != "ready":
        problems.append("the build did not finish (no faiss index yet): run `metricsearch index build ... --resume`")
    model_file = db / model["file"]
    if not model_file.is_file():
        problems.append(f"the model file {model_file} is missing")
    elif file_sha256(model_file) != model["fingerprint"]:
        problems.append(f"{model_file} has changed: its sha256 is not the fingerprint {model['fingerprint'][:12]} "
                        "stored at build time")
    items, vectors = store.ids(txn, "items"), store.ids(txn, "embeddings")
    problems += _differ(items, vectors, "items", "embeddings")
    extra_thumbs = np.setdiff1d(store.ids(txn, "thumbnails"), items)
    if len(extra_thumbs):
        problems.append(f"{len(extra_thumbs)} thumbnail(s) belong to no item")
    hashed = np.array(sorted(int.from_bytes(v, "big") for v in txn.cursor(db=store.dbs["hashes"]).iternext(keys=False)))
    problems += _differ(items, hashed.astype(np.int64), "items", "the sha256 table")
    width = 4 * int(model["dim"])
    bad = sum(len(v) != width for v in txn.cursor(db=store.dbs["embeddings"]).iternext(keys=False))
    if bad:
        problems.append(f"{bad} embedding(s) are not {model['dim']}-d float32 vectors")
    _check_checksums(store, txn, problems, notes)
    try:
        loaded = load_index(db)
    except UnusableIndex as exc:
        problems.append(str(exc))
        return {"count": len(items), "faiss_count": None}
    if loaded is None:
        if state == "ready":
            problems.append(f"no faiss index in {db / 'index'}")
        return {"count": len(items), "faiss_count": None}
    index, header = loaded
    if header["version"] > version:
        return None
    if header["fingerprint"] != model["fingerprint"] or header["dim"] != model["dim"]:
        problems.append("the faiss index was built for another model (fingerprint or dimension differ)")
    changes = store.log_since(txn, header["version"], version)
    if changes is None:
        problems.append(f"the faiss file (write {header['version']}) is older than the change log reaches")
        return {"count": len(items), "faiss_count": int(index.ntotal)}
    added, removed = net_changes(changes)
    if len(changes):
        notes.append(f"the faiss file is {version - header['version']} write(s) behind the LMDB; its change log "
                     f"brings it up to date ({len(added)} added, {len(removed)} removed), as every reader does")
    removable = describe(index)["removable"]
    in_faiss = np.union1d(index_ids(index), added)
    if removable:
        in_faiss = np.setdiff1d(in_faiss, removed)
    missing, dead = np.setdiff1d(items, in_faiss), np.setdiff1d(in_faiss, items)
    if len(missing):
        problems.append(f"{len(missing)} LMDB item(s) are not in the faiss index "
                        f"(e.g. {', '.join(map(str, missing[:5]))})")
    if removable and len(dead):
        problems.append(f"{len(dead)} id(s) in the faiss index are not LMDB items "
                        f"(e.g. {', '.join(map(str, dead[:5]))})")
    elif len(dead):
        unexplained = np.setdiff1d(dead, np.union1d(store.ids(txn, "tombstones"), removed))
        if len(unexplained):
            problems.append(f"{len(unexplained)} id(s) in the faiss index are neither items nor removed items")
        notes.append(f"{len(dead)} removed id(s) stay in the {header['kind']} index, filtered at search time, "
                     "until `metricsearch index rebuild`")
    return {"count": len(items), "faiss_count": int(len(in_faiss) - len(dead)), "index_type": header["factory"],
            "version": version}
