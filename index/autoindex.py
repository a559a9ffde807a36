"""The automatic index: build the candidate faiss indexes that fit the memory budget, tune each one's
search parameter to the recall target, time each, keep the fastest (`build_index`).

Every candidate holds all N vectors, so its recall and speed are measured on the gallery itself, not
predicted; what is sampled is what predicts the full index: IVF coarse quantizers are trained (k-means)
on a random sample of the rows (40 per list, 16 per list with an HNSW quantizer). IVF candidates cost
one k-means on a bounded sample and one pass over the vectors, and are always built. An HNSW graph
costs more than linear time, so HNSW is built only when its estimated time (a pilot build on PILOT
vectors, scaled by N (ln N / ln PILOT)^2) fits what is left of the budget: BUDGET times the first
candidate's build + tune time, MIN_BUDGET_S at least. A candidate whose search, at a setting still
below the target, is already PRUNE times slower than the fastest candidate meeting it stops tuning
(a larger setting only takes longer). The others are listed as skipped, with the reason.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass

import faiss
import numpy as np

from .faiss_index import (MEMORY_FRACTION, TARGET_RECALL, TRAIN_PER_LIST, TUNE_K, _inner,
                          available_memory, build_index as build_factory, choose_index, describe, ivf_lists,
                          make_index, memory_bytes, tune, tuning_queries)

log = logging.getLogger("metricsearch.index")

EXACT_ONLY = 2_000  # up to this many vectors exact search is the only candidate (nothing beats it there)
FLAT_CANDIDATE_MAX = 50_000  # exact search is a candidate up to this many vectors
HNSW_M = (16, 32)  # HNSW graph degrees tried
HNSW_QUANTIZER_MIN = 500_000  # from here on IVF with an HNSW coarse quantizer is a candidate
HNSW_QUANTIZER_POINTS = 64  # ...with about this many vectors per list
NITER = 6  # k-means iterations of IVF candidates (faiss's 25 buy little recall at a given nprobe)
PRUNE = 1.5  # a candidate's tuning stops once a setting below the target is this much slower than the best
BUDGET = 2.0  # the comparison may take this many times the first candidate's build + tune time
MIN_BUDGET_S = 30.0  # ...and at least this many seconds
PILOT = 20_000  # HNSW build time is estimated from a build on this many vectors
TIMED_BATCHES = 10  # batches of 256 queries timed per candidate (the median counts)
TIMED_SINGLE = 200  # single queries timed per candidate (the median counts)
TIMING_S = 1.0  # ...or fewer (3 at least) where they take longer than this


@dataclass(frozen=True)
class Candidate:
    """A faiss factory string, its family (flat, ivf, hnsw) and its estimated bytes."""

    factory: str
    family: str
    bytes: int


def candidates(n: int, dim: int, memory: int | None = None) -> list[Candidate]:
    """The indexes worth comparing for n vectors of `dim` within MEMORY_FRACTION of `memory` (default:
    available now), the reference first: IVF with an HNSW quantizer (large galleries) or IVF-Flat at
    the rule's list count, then IVF-Flat (the rule's lists; small galleries: also half and twice as many),
    exact search (small ones), HNSW at HNSW_M; SQ8 and PQ codes only when none of those fit."""
    budget = MEMORY_FRACTION * (memory if memory is not None else available_memory())
    flat = n * (4 * dim + 8)
    if n <= EXACT_ONLY:
        return [Candidate("IDMap,Flat", "flat", flat)]
    lists, out = ivf_lists(n), []
    if n >= HNSW_QUANTIZER_MIN:
        nlist = 2 ** round(math.log2(n / HNSW_QUANTIZER_POINTS))
        out.append(Candidate(f"IVF{nlist}_HNSW32,Flat", "ivf", flat + nlist * (4 * dim + 256)))
    counts = [lists] if n >= HNSW_QUANTIZER_MIN else [lists, max(1, lists // 2), min(2 * lists, n // TRAIN_PER_LIST)]
    out += [Candidate(f"IVF{c},Flat", "ivf", flat + c * dim * 4) for c in dict.fromkeys(counts)]
    out += [Candidate("IDMap,Flat", "flat", flat)] if n <= FLAT_CANDIDATE_MAX else []
    out += [Candidate(f"IDMap,HNSW{m}", "hnsw", flat + n * 8 * m) for m in HNSW_M]  # 2m links of 4 bytes
    fitting = [c for c in out if c.bytes <= budget]
    if fitting:
        return fitting
    compressed = [Candidate(f"IVF{lists},SQ8", "ivf", n * (dim + 8)),
                  Candidate("IDMap,HNSW32_SQ8", "hnsw", n * (dim + 264))]
    pq = choose_index(n, dim, "ivfpq", memory)
    pq_bytes = int(re.search(r",PQ(\d+)", pq.factory).group(1))
    return [c for c in compressed if c.bytes <= budget] or [Candidate(pq.factory, "ivf", n * (pq_bytes + 8))]


def pilot_seconds(vectors: np.ndarray, factory: str, seed: int = 0) -> float:
    """Estimated seconds to build an HNSW index `factory` of all `vectors`, from a build on PILOT of them."""
    n = len(vectors)
    if n <= PILOT:
        return 0.0
    rows = np.sort(np.random.default_rng(seed).choice(n, PILOT, replace=False))
    index, x = make_index(factory, vectors.shape[1]), np.ascontiguousarray(vectors[rows])
    start = time.perf_counter()
    if not index.is_trained:  # HNSW over SQ8 codes
        index.train(x)
    index.add_with_ids(x, rows.astype(np.int64))
    return (time.perf_counter() - start) * n / PILOT * (math.log(n) / math.log(PILOT)) ** 2


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


def _tuned(index: faiss.Index, vectors: np.ndarray, ids: np.ndarray, truth, target: float,
           give_up_ms: float | None = None) -> dict:
    """Tune an index to the target on the queries of `truth` (see `tune` for `give_up_ms`): its setting,
    recall and milliseconds per tuning query."""
    tuning = tune(index, vectors, ids, target=target, truth=truth, give_up_ms=give_up_ms)
    lower = tuning.get("recall_at_10_lower", tuning["recall_at_10"])
    return {"params": tuning["params"], "recall_at_10": tuning["recall_at_10"], "recall_at_10_lower": lower,
            "meets_target": lower >= target and not tuning.get("gave_up"), "queries": len(truth.rows),
            "tuning_ms": tuning.get("ms_per_query", 0.0), "gave_up": tuning.get("gave_up", False)}


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
            result.pop("gave_up")
        report = {"factory": choice.factory, "reason": choice.reason, **result, "candidates": [], "skipped": []}
        return built, _finish(report, built, n, target_recall, start)
    truth = tuning_queries(vectors, ids, seed=seed) if n > 1 else None
    room = MEMORY_FRACTION * (memory if memory is not None else available_memory())
    rows, built, skipped, budget, reference = [], [], [], math.inf, None
    for cand in candidates(n, dim, memory):
        spent = time.perf_counter() - start
        estimate = pilot_seconds(vectors, cand.factory, seed) if cand.family == "hnsw" else 0.0
        why = (f"estimated {estimate:.0f} s, {max(budget - spent, 0):.0f} s of the {budget:.0f} s budget left"
               if cand.family == "hnsw" and spent + estimate > budget
               else f"{cand.bytes / 2**20:.0f} MiB more than the memory left"
               if cand.bytes + sum(r["memory_bytes"] for r in rows) > room
               else None)
        if why:
            skipped.append({"factory": cand.factory, "reason": why})
            continue
        began = time.perf_counter()
        idx, _ = build_factory(vectors, ids, cand.factory, device, seed, exclude=truth.rows if truth else None,
                               niter=NITER)
        build_s = time.perf_counter() - began
        bound = min((PRUNE * r["tuning_ms"] for r in rows if r["meets_target"]), default=None)
        result = _tuned(idx, vectors, ids, truth, target_recall, bound) if truth else {
            "params": {}, "recall_at_10": 1.0, "recall_at_10_lower": 1.0, "meets_target": True, "gave_up": False}
        if result.pop("gave_up"):
            (name, value), = result["params"].items()
            skipped.append({"factory": cand.factory, "reason": (
                f"built; at {name}={value} (recall@10 {result['recall_at_10']:.3f}) already over {PRUNE}x slower than "
                "the fastest candidate meeting the target, so not tuned further")})
            continue
        rows.append({"factory": cand.factory, **result, "build_s": round(build_s, 2),
                     "tune_s": round(time.perf_counter() - began - build_s, 2), "memory_bytes": index_bytes_at(idx, n)})
        built.append(idx)
        if reference is None:  # the budget: BUDGET x the first candidate's cost, tuning queries included
            reference = time.perf_counter() - start
            budget = max(BUDGET * reference, MIN_BUDGET_S)
    timings = _timed(built, truth.queries) if truth else [{"ms_batch_1": 0.0, "ms_batch_256": 0.0}]
    for row, timing in zip(rows, timings):
        row.update(timing)
        log.info("faiss: candidate %s", row)
    for row in skipped:
        log.info("faiss: candidate %s skipped: %s", row["factory"], row["reason"])
    winner, reason = pick(rows, target_recall)
    best = built[rows.index(winner)]
    built.clear()
    report = {k: winner[k] for k in ("factory", "params", "recall_at_10", "recall_at_10_lower", "meets_target",
                                     "ms_batch_1", "ms_batch_256", "build_s", "tune_s")}
    report["queries"] = winner.get("queries", 0)
    report.update(reason=_exact_only(n) if n <= EXACT_ONLY else reason, candidates=rows, skipped=skipped,
                  budget_s=round(budget, 1) if reference else None,
                  reference_s=round(reference, 2) if reference else None)
    return best, _finish(report, best, n, target_recall, start)


def _finish(report: dict, index: faiss.Index, n: int, target: float, start: float) -> dict:
    """The report with the common fields: target, items, kind, memory, seconds."""
    report.setdefault("recall_at_10", 1.0)
    report.setdefault("recall_at_10_lower", report["recall_at_10"])
    report.update(target=target, items=n, kind=describe(index)["kind"], memory_bytes=index_bytes_at(index, n),
                  total_s=round(time.perf_counter() - start, 2))
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
    """The candidate with the smallest measured time per query at batch 256 among those meeting the
    target (none does: the highest lower recall bound), and why, in one line."""
    meeting = [r for r in rows if r["meets_target"]]
    if not meeting:
        best = max(rows, key=lambda r: r["recall_at_10_lower"])
        return best, f"no candidate reached recall@10 {target} (lower bound): the highest, {best['recall_at_10_lower']}"
    ranked = sorted(meeting, key=lambda r: r["ms_batch_256"])
    best = ranked[0]
    why = (f"fastest at batch 256 of {len(meeting)} of {len(rows)} candidates meeting recall@10 >= {target} "
           f"(lower 95% bound): {best['ms_batch_256'] * 1e3:.1f} us/query")
    if len(ranked) > 1:
        second = ranked[1]
        why += f", {second['ms_batch_256'] / max(best['ms_batch_256'], 1e-9):.2f}x faster than {second['factory']}"
    return best, why


def candidate_lines(report: dict) -> list[str]:
    """One line per candidate of a build_index report: setting, recall, measured speed, the winner
    marked; then one per candidate skipped, with the reason."""
    out = []
    for r in report.get("candidates", []):
        params = ",".join(f"{k}={v}" for k, v in r["params"].items()) or "exact"
        mark = "*" if r["factory"] == report["factory"] else " "
        out.append(f"{mark}{r['factory']} {params}: recall@10 {r['recall_at_10']:.3f} "
                   f"(lower {r['recall_at_10_lower']:.3f}), "
                   f"{r['ms_batch_256'] * 1e3:.1f} us/query at batch 256, {r['ms_batch_1'] * 1e3:.1f} us at batch 1, "
                   f"built in {r['build_s']:.1f} s")
    out += [f" {r['factory']}: skipped ({r['reason']})" for r in report.get("skipped", [])]
    return out
