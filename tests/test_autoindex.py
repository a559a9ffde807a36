"""The automatic index on small synthetic vector sets: exact search for tiny galleries, the winner is
the fastest candidate meeting the recall target by the report's own measurements, every candidate
holding every vector, the time budget skipping what does not fit (said why), IVF with an HNSW
quantizer, and removals through the gallery's search state on every type."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from metricsearch.index import autoindex, build_index
from metricsearch.index.autoindex import candidate_lines, candidates, pilot_seconds
from metricsearch.index.catalog import Catalog
from metricsearch.index.faiss_index import build_index as build_factory, describe, index_ids, recall_without_self, tune
from metricsearch.index.layout import REMOVE, ItemRecord
from metricsearch.index.state import IndexState


def clustered(n: int, dim: int = 32, clusters: int = 150, spread: float = 0.35, draw: int = 0) -> np.ndarray:
    """Unit vectors around fixed random centres; `draw` picks another sample of the same distribution."""
    centres = np.random.default_rng(0).normal(size=(clusters, dim))
    rng = np.random.default_rng(draw + 1)
    x = centres[rng.integers(0, clusters, n)] + spread * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def fresh_recall(index: faiss.Index, vectors: np.ndarray, ids: np.ndarray) -> float:
    """Recall@10 of the index against exact search for 300 vectors it has never seen."""
    queries = clustered(300, vectors.shape[1], draw=9)
    _, exact = faiss.knn(queries, vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)
    return recall_without_self(index.search(queries, 10)[1], ids[exact], np.full(300, -1), 10)


def test_a_tiny_gallery_gets_exact_search() -> None:
    x = clustered(1_500)
    index, report = build_index(x)
    assert report["factory"] == "IDMap,Flat" and describe(index)["exact"] and index.ntotal == 1_500
    assert [c["factory"] for c in report["candidates"]] == ["IDMap,Flat"] and report["recall_at_10"] == 1.0
    assert (report["skipped"] == [] and report["kind"] == "flat"
            and "exact search, the only candidate" in report["reason"])


@pytest.mark.parametrize("target", [0.95, 0.99])
def test_the_winner_is_the_fastest_candidate_meeting_the_target(target) -> None:
    x = clustered(3_000)
    ids = np.arange(3_000, dtype=np.int64) * 7 + 5
    index, report = build_index(x, ids, target_recall=target)
    rows = report["candidates"]  # the rest: pruned while tuning (slower than the best at a lower setting)
    assert {c["factory"] for c in rows + report["skipped"]} == {c.factory for c in candidates(3_000, 32)}
    assert all("not tuned further" in s["reason"] for s in report["skipped"])
    assert {describe(faiss.index_factory(32, c["factory"]))["kind"] for c in rows} >= {"flat", "ivf", "hnsw"}
    meeting = [c for c in rows if c["recall_at_10_lower"] >= target]
    assert meeting and all(c["meets_target"] == (c in meeting) for c in rows)
    fastest = min(meeting, key=lambda c: c["ms_batch_256"])
    assert report["factory"] == fastest["factory"] and report["params"] == fastest["params"]
    assert report["recall_at_10_lower"] >= target and report["target"] == target
    for c in rows:  # every approximate candidate was tuned: its parameter is set and its recall measured
        assert describe(faiss.index_factory(32, c["factory"]))["exact"] or c["params"], c
        assert c["ms_batch_1"] > 0 and c["ms_batch_256"] > 0 and c["build_s"] >= 0
    assert str(round(fastest["ms_batch_256"] * 1e3, 1)) in report["reason"]
    assert index_ids(index).tolist() == ids.tolist()
    assert fresh_recall(index, x, ids) >= target - 0.04  # the tuned setting holds on unseen queries
    lines = candidate_lines(report)
    assert len(lines) == len(rows) + len(report["skipped"]) and sum(line.startswith("*") for line in lines) == 1


def test_the_time_budget_builds_the_reference_and_skips_what_does_not_fit(monkeypatch) -> None:
    x = clustered(10_000)
    monkeypatch.setattr(autoindex, "MIN_BUDGET_S", 0.0)
    monkeypatch.setattr(autoindex, "BUDGET", 1.0)  # the first candidate alone spends it
    index, report = build_index(x)
    planned = [c for c in candidates(10_000, 32)]
    graphs = [c.factory for c in planned if c.family == "hnsw"]  # IVF costs linear time: always built
    pruned = [s["factory"] for s in report["skipped"] if "not tuned further" in s["reason"]]
    assert (sorted([c["factory"] for c in report["candidates"]] + pruned)
            == sorted(c.factory for c in planned if c.family != "hnsw"))
    assert [s["factory"] for s in report["skipped"] if "budget left" in s["reason"]] == graphs and len(graphs) == 2
    assert report["budget_s"] == pytest.approx(report["reference_s"], abs=0.06) and index.ntotal == 10_000
    lines = candidate_lines(report)
    assert (sum(line.startswith("*") for line in lines) == 1
            and sum("skipped" in line for line in lines) == 2 + len(pruned))
    monkeypatch.setattr(autoindex, "PILOT", 1_000)  # HNSW's build time is estimated from a smaller one
    assert pilot_seconds(x, "IDMap,HNSW32") > 0 and pilot_seconds(x[:900], "IDMap,HNSW32") == 0.0
    assert pilot_seconds(x, "IDMap,HNSW32_SQ8") > 0  # trained first


def test_every_candidate_holds_every_vector_ivf_with_an_hnsw_quantizer_among_them(monkeypatch) -> None:
    monkeypatch.setattr(autoindex, "HNSW_QUANTIZER_MIN", 5_000)
    monkeypatch.setattr(autoindex, "PRUNE", float("inf"))  # every candidate tuned to the end
    x = clustered(10_000)
    ids = np.arange(10_000, dtype=np.int64) * 3
    index, report = build_index(x, ids)
    rows = {c["factory"]: c for c in report["candidates"]}
    assert "IVF128_HNSW32,Flat" in rows and set(rows) == {c.factory for c in candidates(10_000, 32)}
    assert rows["IVF128_HNSW32,Flat"]["meets_target"] and rows["IVF128_HNSW32,Flat"]["params"]["nprobe"] >= 1
    winner = min((c for c in rows.values() if c["meets_target"]), key=lambda c: c["ms_batch_256"])
    assert report["factory"] == winner["factory"] and report["queries"] == 4_000 and report["items"] == 10_000
    assert index_ids(index).tolist() == ids.tolist() and fresh_recall(index, x, ids) >= 0.91


def test_tuning_gives_up_once_slower_than_a_bound_and_auto_prunes_such_candidates(monkeypatch) -> None:
    x = clustered(10_000)
    ids = np.arange(10_000, dtype=np.int64)
    index, rows = build_factory(x, ids, "IVF256,Flat")
    held = np.setdiff1d(ids, rows)
    full = tune(index, x, ids, held, target=0.99)
    assert full["params"]["nprobe"] > 1 and full["ms_per_query"] > 0 and "gave_up" not in full
    quit_ = tune(index, x, ids, held, target=0.99, give_up_ms=0.0)  # every setting is slower than 0 ms
    assert quit_["gave_up"] and quit_["params"] == {"nprobe": 1} and quit_["recall_at_10_lower"] < 0.99
    monkeypatch.setattr(autoindex, "PRUNE", 0.0)
    _, report = build_index(x, target_recall=0.99)
    assert all("not tuned further" in s["reason"] for s in report["skipped"]) and report["skipped"]
    assert all(c["meets_target"] for c in report["candidates"])  # the rest gave up at their first setting


def test_memory_budget_limits_the_candidates() -> None:
    roomy = candidates(1_000_000, 128, memory=2**40)
    assert [c.factory for c in roomy] == ["IVF16384_HNSW32,Flat", "IVF4096,Flat", "IDMap,HNSW16", "IDMap,HNSW32"]
    assert [c.factory for c in candidates(100_000, 128, memory=2**40)] == [
        "IVF2048,Flat", "IVF1024,Flat", "IVF2500,Flat", "IDMap,HNSW16", "IDMap,HNSW32"]
    short = candidates(1_000_000, 128, memory=int(2**30 * 0.8))  # 0.4 GiB budget: float32 takes 0.5 GB
    assert [c.factory for c in short] == ["IVF4096,SQ8", "IDMap,HNSW32_SQ8"]
    tight = candidates(1_000_000, 128, memory=2**27)
    assert len(tight) == 1 and ",PQ" in tight[0].factory and tight[0].bytes <= 2**26


@pytest.mark.parametrize("request_", ["auto", "flat", "ivf", "hnsw", "IVF16,SQ8", "IVF64_HNSW32,Flat"])
def test_removed_items_never_come_back_on_any_type(request_) -> None:
    x = clustered(3_000)
    ids = np.arange(3_000, dtype=np.int64) + 100
    index, report = build_index(x, ids, index=request_)
    records = [(int(i), ItemRecord(f"/p/{i}.png", "ab"[i % 2], bytes(32), 1)) for i in ids]
    info = describe(index)
    state = IndexState(index, index, info, {"params": report["params"]}, np.zeros(0, np.int64), Catalog.of(records),
                       0, 0, "cpu")
    queries = x[:50]
    gone = np.unique(np.concatenate([state.search(queries, 5, None)[q].ids[:3] for q in range(50)]))
    state.apply(None, None, [(REMOVE, gone)], 1, catalog_current=True)
    assert (len(state.tombstones) == 0) == info["removable"]  # HNSW cannot remove: filtered at search time
    for label in (None, "a"):
        found = np.concatenate([h.ids for h in state.search(queries, 10, label)])
        assert len(found) and not np.isin(found, gone).any()
    assert len(np.concatenate([h.ids for h in state.search(queries, 10, None)])) == 500
