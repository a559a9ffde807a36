"""Galleries larger than memory, on real galleries of clustered vectors written through the gallery's own writer and
faiss build: compressed codes chosen by the index memory budget and re-ranked with the float vectors of the LMDB,
and the faiss index memory-mapped from its file (the same results as loaded; additions and removals of another
writer followed without changing the mapped file)."""

from __future__ import annotations

import hashlib
import json
import shutil
from functools import partial
from pathlib import Path

import faiss
import numpy as np
import pytest
from PIL import Image

from metricsearch.app.cli import main
from metricsearch.index import Gallery, build_index, gallery_info
from metricsearch.index.faiss_index import recall_without_self
from metricsearch.index.jobs import _create, build_faiss
from metricsearch.index.lmdb_store import Store
from metricsearch.index.pipeline import ReadItem, ReadSettings
from metricsearch.index.writer import GalleryWriter, job_record
from metricsearch.models import OnnxEmbedder

from onnx_models import pixel_correlation_onnx
from test_autoindex import clustered

N, DIM = 12_000, 64  # 3.1 MB of float32; 0.9 MB of memory leaves the index 0.45 MB: 16-byte PQ codes (0.37 MB)
MEMORY = 900_000


def items(start: int, stop: int) -> list[ReadItem]:
    """Items without images for rows start..stop: source v/<row>, label a, b or c by row."""
    return [ReadItem(i, f"v/{i}", "abc"[i % 3], sha256=hashlib.sha256(b"%d" % i).digest(), size=1)
            for i in range(start, stop)]


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return clustered(N, dim=DIM, clusters=300)


@pytest.fixture(scope="module")
def compressed(vectors, tmp_path_factory) -> Path:
    """A gallery of `vectors` whose `auto` index was built within MEMORY (as `index build --index-memory`)."""
    db = tmp_path_factory.mktemp("compressed") / "gallery"
    model = pixel_correlation_onnx(db.parent / "model.onnx", size=8, channels=1)
    with Store.opened(db, writable=True) as store:
        _create(store, db, model, OnnxEmbedder(model, "cpu"), ReadSettings(thumbnail_size=0), "auto", "vectors", None)
        GalleryWriter(store).write_batch(items(0, N), vectors)
        build_faiss(store, db, None, "cpu", build=partial(build_index, memory=MEMORY))
    return db


def recall(found: np.ndarray, vectors: np.ndarray, queries: np.ndarray) -> float:
    exact = faiss.knn(queries, vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)[1]
    return recall_without_self(found, exact, np.full(len(queries), -1), 10)


def test_the_budget_chooses_compressed_codes_that_rerank_to_the_target_with_the_stored_vectors(compressed,
                                                                                                 vectors) -> None:
    queries = clustered(400, dim=DIM, clusters=300, draw=6)
    with Gallery.open(compressed, device="cpu") as gallery:
        info = gallery.info()
        found = np.stack([h.ids for h in gallery.search(queries, 10)])
        raw = gallery._state.index.search(queries, 10)[1]  # the same index, its codes' own ranking
        labelled = gallery.search(queries[:50], 10, label="b")
    assert ",PQ16x8np" in info["index_type"] and info["rerank"] > 0 and not info["exact"]
    assert not info["index_mmap"] and info["tuning"]["recall_at_10_lower"] >= 0.95
    assert "without re-ranking" in info["index_candidates"][0] or "without re-ranking" in info["index_candidates"][1]
    assert recall(found, vectors, queries) >= 0.93 > recall(raw, vectors, queries) + 0.02
    assert all(h.label == "b" for hits in labelled for h in hits) and sum(map(len, labelled)) > 50 * 5
    assert info["size_bytes"]["faiss"] < N * DIM  # codes: under a quarter of the float vectors


def test_a_memory_mapped_index_serves_the_loaded_results_and_follows_another_writer(compressed, vectors, tmp_path,
                                                                                   capsys) -> None:
    db = tmp_path / "gallery"
    shutil.copytree(compressed, db)
    queries = clustered(200, dim=DIM, clusters=300, draw=8)
    with Gallery.open(db, device="cpu", mmap=False) as loaded, Gallery.open(db, device="cpu", mmap=True) as mapped:
        assert mapped.info()["index_mmap"] and not loaded.info()["index_mmap"] and not mapped.removable
        for label in (None, "c"):
            a, b = loaded.search(queries, 10, label=label), mapped.search(queries, 10, label=label)
            assert all(np.array_equal(x.ids, y.ids) and np.allclose(x.scores, y.scores) for x, y in zip(a, b))
    assert gallery_info(db, device="cpu")["index_mmap"] is False  # a small file is loaded
    new = clustered(60, dim=DIM, clusters=300, draw=9)
    with Store.opened(db, writable=True) as store, Gallery(db, store, device="cpu", mmap=True) as gallery:
        writer = GalleryWriter(store)
        added = writer.write_batch(items(N, N + 60), new)
        gone = np.array([h.ids[0] for h in gallery.search(queries[:30], 1)])
        writer.remove(gone, tombstones=True, job=job_record("remove"))
        gallery.refresh()  # replayed from the change log: the mapped file itself never changes
        assert [int(hits.ids[0]) for hits in gallery.search(new, 1)] == added.tolist()
        found = np.concatenate([h.ids for h in gallery.search(queries, 20)])
        assert len(found) == 200 * 20 and not np.isin(found, gone).any() and len(gallery) == N + 60 - len(set(gone))
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (8, 8), dtype=np.uint8)).save(tmp_path / "q.png")
    assert main(["search", "--db", str(db), "--image", str(tmp_path / "q.png"), "--mmap", "--json", "-k", "3"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3
