"""The automatic index: build the candidate faiss indexes that fit the memory budget, tune each one's
search parameter to the recall target, time each, keep the fastest (`build_index`).

Candidates are compared on a random sample of at most SAMPLE vectors, IVF list counts scaled with it
(the same points per list as the full index would have); each one's per-query time at full size is
predicted from the sample's by how its search cost grows with N: linearly for flat and IVF (the same
share of the lists is probed, and the lists grow with N), logarithmically for HNSW (graph depth).
The winner is then built on every vector and tuned and timed there; its report keeps both numbers.
Galleries of at most SAMPLE vectors are compared on all of them, so nothing is predicted.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass

import faiss
import numpy as np

from .faiss_index import (MEMORY_FRACTION, TARGET_RECALL, TRAIN_PER_LIST, TUNE_K, _inner, available_memory,
                          build_index as build_factory, choose_index, describe, ivf_lists, memory_bytes, tune,
                          tuning_queries)

log = logging.getLogger("metricsearch.index")

SAMPLE = 100_000  # candidates are built, tuned and timed on at most this many vectors
EXACT_ONLY = 2_000  # up to this many vectors exact search is the only candidate (nothing beats it there)
FLAT_CANDIDATE_MAX = 50_000  # exact search is a candidate up to this many vectors
HNSW_M = (16, 32)  # HNSW graph degrees tried
HNSW_QUANTIZER_MIN = 4_000_000  # from here on IVF with an HNSW coarse quantizer is a candidate
TIMED_BATCHES = 10  # batches of 256 queries timed per candidate (the median counts)
TIMED_SINGLE = 200  # single queries timed per candidate (the median counts)
TIMING_S = 1.0  # ...or fewer (3 at least) where they take longer than this


@dataclass(frozen=True)
class Candidate:
    """A faiss factory string for the full gallery, its family (flat, ivf, hnsw) and its estimated bytes."""

    factory: str
    family: str
    bytes: int


def candidates(n: int, dim: int, memory: int | None = None) -> list[Candidate]:
    """The indexes worth comparing for n vectors of `dim` within MEMORY_FRACTION of `memory` (default:
    available now): exact (small galleries), IVF-Flat at 3 list counts, HNSW at HNSW_M, IVF with an
    HNSW quantizer (large ones); SQ8 and PQ codes only when none of those fit."""
    budget = MEMORY_FRACTION * (memory if memory is not None else available_memory())
    flat = n * (4 * dim + 8)
    if n <= EXACT_ONLY:
        return [Candidate("IDMap,Flat", "flat", flat)]
    out = [Candidate("IDMap,Flat", "flat", flat)] if n <= FLAT_CANDIDATE_MAX else []
    lists = ivf_lists(n)
    for nlist in sorted({max(1, lists // 2), lists, min(2 * lists, n // TRAIN_PER_LIST)}):
        out.append(Candidate(f"IVF{nlist},Flat", "ivf", flat + nlist * dim * 4))
    out += [Candidate(f"IDMap,HNSW{m}", "hnsw", flat + n * 8 * m) for m in HNSW_M]  # 2m links of 4 bytes
    if n >= HNSW_QUANTIZER_MIN:
        nlist = 2 ** math.ceil(math.log2(16 * math.sqrt(n)))
        out.append(Candidate(f"IVF{nlist}_HNSW32,Flat", "ivf", flat + nlist * (4 * dim + 256)))
    fitting = [c for c in out if c.bytes <= budget]
    if fitting:
        return fitting
    compressed = [Candidate(f"IVF{lists},SQ8", "ivf", n * (dim + 8)), Candidate("IDMap,HNSW32_SQ8", "hnsw", n * (dim + 264))]
    pq = choose_index(n, dim, "ivfpq", memory)
    pq_bytes = int(re.search(r",PQ(\d+)", pq.factory).group(1))
    return [c for c in compressed if c.bytes <= budget] or [Candidate(pq.factory, "ivf", n * (pq_bytes + 8))]


def scaled_factory(factory: str, ratio: float) -> str:
    """The factory string with its IVF list count multiplied by `ratio` (for a sample of the vectors)."""
    return re.sub(r"^IVF(\d+)", lambda m: f"IVF{max(1, round(int(m.group(1)) * ratio))}", factory)


def growth(family: str, sample: int, n: int) -> float:
    """How much a query's time grows from `sample` to n vectors: linearly for flat and IVF (the same
    share of the lists probed), with log N for HNSW."""
    if sample >= n:
        return 1.0
    return n / sample if family != "hnsw" else math.log(n) / math.log(max(sample, 2))


def ms_per_query(indexes: list[faiss.Index], queries: np.ndarray, batch: int, calls: int, k: int = TUNE_K,
                 seconds: float = TIMING_S) -> list[float]:
    """Median milliseconds per query of each index over `calls` searches of `batch` queries (after one
    warm-up), fewer (3 at least) where they take more than `seconds` an index; the indexes take turns
    call by call (which goes first rotates), so that all see the same load on a shared machine."""
    times: list[list[float]] = [[] for _ in indexes]
    order = list(range(len(indexes)))
    for c in range(calls + 1):
        x = np.ascontiguousarray(np.take(queries, np.arange(c * batch, (c + 1) * batch) % len(queries), axis=0))
        for i in order[c % len(order):] + order[:c % len(order)]:
            start = time.perf_counter()
            indexes[i].search(x, k + 1)
            times[i].append(time.perf_counter() - start)
        if c >= 3 and sum(map(sum, times)) > seconds * len(indexes):
            break
    return [1e3 * float(np.median(t[1:])) / batch for t in times]


def index_bytes_at(index: faiss.Index, n: int) -> int:
    """Bytes an index of this type takes with n vectors, HNSW links included."""
    inner = _inner(index)[0]
    links = n * 8 * inner.hnsw.nb_neighbors(1) if isinstance(inner, faiss.IndexHNSW) else 0
    return memory_bytes(index, n) + links


def _tuned(index: faiss.Index, vectors: np.ndarray, ids: np.ndarray, truth, target: float) -> dict:
    """Tune an index to the target on the queries of `truth`: its setting and recall."""
    tuning = tune(index, vectors, ids, target=target, truth=truth)
    lower = tuning.get("recall_at_10_lower", tuning["recall_at_10"])
    return {"params": tuning["params"], "recall_at_10": tuning["recall_at_10"], "recall_at_10_lower": lower,
            "meets_target": lower >= target, "queries": len(truth.rows)}


def _timed(indexes: list[faiss.Index], queries: np.ndarray) -> list[dict]:
    """Each index's milliseconds per query at batch 1 and 256, the indexes timed in turn."""
    single = ms_per_query(indexes, queries, 1, TIMED_SINGLE)
    batched = ms_per_query(indexes, queries, 256, TIMED_BATCHES)
    return [{"ms_batch_1": round(a, 5), "ms_batch_256": round(b, 5)} for a, b in zip(single, batched)]


def build_index(vectors: np.ndarray, ids: np.ndarray | None = None, *, target_recall: float = TARGET_RECALL,
                index: str = "auto", memory: int | None = None, device: str = "cpu",
                seed: int = 0) -> tuple[faiss.Index, dict]:
    """A tuned inner-product faiss index of L2-normalised `vectors` (under `ids`, default 0..n-1) and its
    report: with `index` auto the fastest candidate meeting recall@10 >= target_recall (lower 95%
    bound) against exact search, else the named index or factory string, tuned to the target."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, dim = vectors.shape
    ids = np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
    start = time.perf_counter()
    if index.strip().lower() != "auto":
        choice = choose_index(n, dim, index, memory)
        built, rows = build_factory(vectors, ids, choice.factory, device, seed)
        result = {"params": {}}
        if n > 1 and not describe(built)["exact"]:
            truth = tuning_queries(vectors, ids, np.setdiff1d(np.arange(n), rows), seed=seed)
            result = {**_tuned(built, vectors, ids, truth, target_recall), **_timed([built], truth.queries)[0]}
        report = {"factory": choice.factory, "reason": choice.reason, **result, "candidates": [], "sample": None}
        return built, _finish(report, built, n, target_recall, start, time.perf_counter())
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(n, SAMPLE, replace=False)) if n > SAMPLE else np.arange(n)
    xs, ids_s = (vectors[sample], ids[sample]) if n > SAMPLE else (vectors, ids)
    truth = tuning_queries(xs, ids_s, seed=seed) if n > 1 else None
    rows, built = [], {}
    for cand in candidates(n, dim, memory):
        began = time.perf_counter()
        factory = scaled_factory(cand.factory, len(sample) / n) if n > SAMPLE else cand.factory
        idx, _ = build_factory(xs, ids_s, factory, device, seed, exclude=truth.rows if truth else None)
        build_s = time.perf_counter() - began
        result = _tuned(idx, xs, ids_s, truth, target_recall) if truth else {
            "params": {}, "recall_at_10": 1.0, "recall_at_10_lower": 1.0, "meets_target": True}
        rows.append({"factory": cand.factory, "family": cand.family, "sample_factory": factory, **result,
                     "build_s": round(build_s, 2), "memory_bytes": index_bytes_at(idx, n)})
        built[cand.factory] = idx
    timings = _timed(list(built.values()), truth.queries) if truth else [{"ms_batch_1": 0.0, "ms_batch_256": 0.0}]
    for row, timing in zip(rows, timings):
        grow = growth(row.pop("family"), len(sample), n)
        row.update(timing, predicted_ms_batch_1=round(timing["ms_batch_1"] * grow, 5),
                   predicted_ms_batch_256=round(timing["ms_batch_256"] * grow, 5))
        log.info("faiss: candidate %s", row)
    winner, reason = pick(rows, target_recall)
    if n <= EXACT_ONLY:
        reason = _exact_only(n)
    chosen = time.perf_counter()
    if n <= SAMPLE:
        best = built[winner["factory"]]
        report = {**{k: winner[k] for k in ("factory", "params", "recall_at_10", "recall_at_10_lower", "meets_target",
                                            "ms_batch_1", "ms_batch_256")}, "build_s": winner["build_s"]}
    else:
        built.clear()
        best, train_rows = build_factory(vectors, ids, winner["factory"], device, seed)
        full_truth = tuning_queries(vectors, ids, np.setdiff1d(np.arange(n), train_rows), seed=seed)
        report = {"factory": winner["factory"], **_tuned(best, vectors, ids, full_truth, target_recall),
                  **_timed([best], full_truth.queries)[0]}
    report.update(reason=reason, candidates=rows, sample=len(sample) if n > SAMPLE else None,
                  choice_s=round(chosen - start, 2))
    return best, _finish(report, best, n, target_recall, start, chosen)


def _finish(report: dict, index: faiss.Index, n: int, target: float, start: float, chosen: float) -> dict:
    """The report with the common fields: target, items, kind, memory, seconds."""
    report.setdefault("recall_at_10", 1.0)
    report.setdefault("recall_at_10_lower", report["recall_at_10"])
    report.update(target=target, items=n, kind=describe(index)["kind"], memory_bytes=index_bytes_at(index, n),
                  final_build_s=round(time.perf_counter() - chosen, 2), total_s=round(time.perf_counter() - start, 2))
    if report["recall_at_10_lower"] < target:
        log.warning("faiss: %s reaches recall@10 %.3f (lower bound %.3f), below the target %.2f", report["factory"],
                    report["recall_at_10"], report["recall_at_10_lower"], target)
    return report


def _exact_only(n: int) -> str:
    return f"{n} <= {EXACT_ONLY} vectors: exact search, the only candidate"


def current_reason(choice: dict, count: int) -> str | None:
    """Why a gallery of `count` vectors has its index, from the `choice` (reason, request, tuning.items)
    made when it was built: items added or removed since are counted, not hidden behind the old size."""
    built = choice.get("tuning", {}).get("items")
    if built is None or built == count:
        return choice.get("reason")
    if choice.get("request") == "auto" and max(built, count) <= EXACT_ONLY:
        return _exact_only(count)
    return (f"chosen for {built} vectors ({choice['reason']}), {count} now; `metricsearch index rebuild` "
            "chooses again for that size")


def pick(rows: list[dict], target: float) -> tuple[dict, str]:
    """The candidate with the smallest predicted time per query at batch 256 among those meeting the
    target (none does: the highest lower recall bound), and why, in one line."""
    meeting = [r for r in rows if r["meets_target"]]
    if not meeting:
        best = max(rows, key=lambda r: r["recall_at_10_lower"])
        return best, f"no candidate reached recall@10 {target} (lower bound): the highest, {best['recall_at_10_lower']}"
    ranked = sorted(meeting, key=lambda r: r["predicted_ms_batch_256"])
    best = ranked[0]
    why = (f"fastest at batch 256 of {len(meeting)} of {len(rows)} candidates meeting recall@10 >= {target} "
           f"(lower 95% bound): {best['predicted_ms_batch_256'] * 1e3:.1f} us/query")
    if len(ranked) > 1:
        second = ranked[1]
        why += f", {second['predicted_ms_batch_256'] / max(best['predicted_ms_batch_256'], 1e-9):.2f}x faster than {second['factory']}"
    return best, why


def candidate_lines(report: dict) -> list[str]:
    """One line per candidate of a build_index report: setting, recall, speed (predicted at full size
    when compared on a sample), the winner marked."""
    sampled = report.get("sample") is not None
    out = []
    for r in report.get("candidates", []):
        params = ",".join(f"{k}={v}" for k, v in r["params"].items()) or "exact"
        mark = "*" if r["factory"] == report["factory"] else " "
        out.append(f"{mark}{r['factory']} {params}: recall@10 {r['recall_at_10']:.3f} (lower {r['recall_at_10_lower']:.3f}), "
                   f"{r['predicted_ms_batch_256'] * 1e3:.1f} us/query at batch 256, {r['predicted_ms_batch_1'] * 1e3:.1f} us "
                   f"at batch 1{' (predicted from the sample)' if sampled else ''}")
    return out
