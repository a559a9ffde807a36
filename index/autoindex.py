"""The automatic index: build the candidate faiss indexes that fit the memory budget, tune each one's
search parameter to the recall target, time each, keep the fastest (`build_index`).

Every candidate holds all N vectors, so its recall and speed are measured on the gallery itself, not
predicted; what is sampled is what predicts the full index: IVF coarse quantizers are trained (k-means)
on a random sample of the rows (40 per list; with an HNSW quantizer 16 at least). IVF candidates cost
one k-means on a bounded sample and one pass over the vectors, and are always built. An HNSW graph
costs more than linear time, so HNSW is built only when its estimated time (a pilot build on PILOT
vectors, scaled by N (ln N / ln PILOT)^2) fits what is left of the budget: BUDGET times the first
candidate's build + tune time, MIN_BUDGET_S at least. A candidate whose search, at a setting still
below the target, is already PRUNE times slower than the fastest candidate meeting it stops tuning
(a larger setting only takes longer). The others are listed as skipped, with the reason.

Vectors that take at most EXACT_BYTES are searched exactly, with no other candidate: exact search
answers a query within a millisecond there. Among the candidates that meet the target, the simplest
(FAMILIES order, then fewer bytes) whose time per query at batch 256 is within SIMPLER_WITHIN of the
fastest's wins, so that timing noise does not change the structure from one build to the next. That time is the
CPU time of a search on one thread (`cpu_ms_per_query`), not the wall time of all threads: other processes on a
busy machine stretch wall time unevenly between structures (a 2M build at load 9 timed two of them 1.07x apart
that are 1.36x apart on idle cores), but hardly the CPU a search takes.
When no float index fits the memory budget, the candidates are compressed (IVF-SQ8, IVF-PQ, OPQ +
IVF-PQ): each re-ranks a shortlist with the float vectors (`faiss_index.reranked`), its length tuned
with nprobe. Candidates with the same coarse lists share one k-means and one assignment of the vectors to
lists (the first one's: the same sample and seed would give the same), so that the compressed ones cost one of
each, not three."""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass
from typing import Callable

import faiss
import numpy as np

from .faiss_index import (HNSW_MIN_PER_LIST, MEMORY_FRACTION, RERANK, TARGET_RECALL, TRAIN_PER_LIST, TUNE_K,
                          IndexChoice, _inner, available_memory, choose_index, describe, index_from_factory,
                          ivf_lists, make_index, memory_bytes, reranked, set_param, shortlist, tune, tuning_queries,
                          vectors_by_id)

log = logging.getLogger("metricsearch.index")

EXACT_BYTES = 24 << 20  # vectors up to this size: exact search only (a query at batch 1 within 1 ms: docs/indexing.md)
SIMPLER_WITHIN = 1.15  # a candidate this close to the fastest's time per query wins if it is simpler
FAMILIES = ("flat", "ivf", "ivf_hnsw", "hnsw", "sq8", "pq", "opq")  # simplest first
PQ_BYTES = (64, 32, 16)  # compressed candidates: PQ (and OPQ + PQ) codes of the largest of these that fits
WIDE_LISTS = 16  # below HNSW_QUANTIZER_MIN, IVF with an HNSW quantizer at about this many x sqrt(N) lists
READ_US = 2.5  # a re-ranked vector read from a gallery's LMDB, in us (random reads measured: docs/indexing.md)
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
    """A faiss factory string, its family (one of FAMILIES) and its estimated bytes."""

    factory: str
    family: str
    bytes: int


def candidates(n: int, dim: int, memory: int | None = None) -> list[Candidate]:
    """The indexes worth comparing for n vectors of `dim` within MEMORY_FRACTION of `memory` (default:
    available now), the reference first: IVF with an HNSW quantizer (large galleries) or IVF-Flat at
    the rule's list count, then IVF-Flat (the rule's lists; small galleries: also half as many, and IVF with
    an HNSW quantizer at WIDE_LISTS x sqrt(N) lists, whose k-means costs less than a flat one's over as many
    lists), exact search (small ones), HNSW at
    HNSW_M; compressed codes (`compressed`) only when none of those fit. Exact search alone for vectors
    of EXACT_BYTES or less (that fit)."""
    budget = MEMORY_FRACTION * (memory if memory is not None else available_memory())
    flat = n * (4 * dim + 8)
    if n * dim * 4 <= EXACT_BYTES and flat <= budget:
        return [Candidate("IDMap,Flat", "flat", flat)]
    lists, out = ivf_lists(n), []
    if n >= HNSW_QUANTIZER_MIN:
        nlist = 2 ** round(math.log2(n / HNSW_QUANTIZER_POINTS))
        out.append(Candidate(f"IVF{nlist}_HNSW32,Flat", "ivf_hnsw", flat + nlist * (4 * dim + 256)))
    counts = [lists] if n >= HNSW_QUANTIZER_MIN else [lists, max(1, lists // 2)]
    out += [Candidate(f"IVF{c},Flat", "ivf", flat + c * dim * 4) for c in dict.fromkeys(counts)]
    wide = min(2 ** round(math.log2(WIDE_LISTS * math.sqrt(n))), n // HNSW_MIN_PER_LIST)
    if n < HNSW_QUANTIZER_MIN and wide > max(counts):
        out.append(Candidate(f"IVF{wide}_HNSW32,Flat", "ivf_hnsw", flat + wide * (4 * dim + 256)))
    out += [Candidate("IDMap,Flat", "flat", flat)] if n <= FLAT_CANDIDATE_MAX else []
    out += [Candidate(f"IDMap,HNSW{m}", "hnsw", flat + n * 8 * m) for m in HNSW_M]  # 2m links of 4 bytes
    fitting = [c for c in out if c.bytes <= budget]
    return fitting or compressed(n, dim, memory)


def compressed(n: int, dim: int, memory: int | None = None) -> list[Candidate]:
    """The compressed candidates for n vectors of `dim` within MEMORY_FRACTION of `memory`: IVF-PQ and OPQ +
    IVF-PQ with codes of the largest PQ_BYTES that fits, then IVF-SQ8 (dim bytes: measured when the memory left
    holds it too), each with the IVF of `candidates`' reference; when all of them fit at once, IVF-SQ8 comes
    first: the most accurate codes meet the target soonest, and the PQ candidates then stop tuning once PRUNE x
    slower than it. When none fits, IVF-PQ with the largest code that does (`choose_index`)."""
    budget = MEMORY_FRACTION * (memory if memory is not None else available_memory())
    if n >= HNSW_QUANTIZER_MIN:
        nlist = 2 ** round(math.log2(n / HNSW_QUANTIZER_POINTS))
        ivf, centroids = f"IVF{nlist}_HNSW32", nlist * (4 * dim + 256)
    else:
        ivf, centroids = f"IVF{ivf_lists(n)}", ivf_lists(n) * 4 * dim
    bits = 8 if n >= 256 * TRAIN_PER_LIST else 4
    out = []
    sizes = [m for m in PQ_BYTES if dim % m == 0 and 2 * m <= dim and n * (m * bits // 8 + 8) + centroids <= budget]
    for m in sizes[:1]:
        out += [Candidate(f"{ivf},PQ{m}x{bits}np", "pq", n * (m * bits // 8 + 8) + centroids),
                Candidate(f"OPQ{m},{ivf},PQ{m}x{bits}np", "opq", n * (m * bits // 8 + 8) + centroids + 4 * dim * dim)]
    out.append(Candidate(f"{ivf},SQ8", "sq8", n * (dim + 8) + centroids))
    fitting = [c for c in out if c.bytes <= budget]
    if fitting and sum(c.bytes for c in fitting) <= budget:  # all held at once: the most accurate codes first
        return sorted(fitting, key=lambda c: c.family != "sq8")
    if fitting:
        return fitting
    pq = choose_index(n, dim, "ivfpq", memory)
    code = int(re.search(r",PQ(\d+)", pq.factory).group(1))
    return [Candidate(pq.factory, "pq", n * (code + 8))]


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


def ms_per_query(searches: list[Callable[[np.ndarray], object]], queries: np.ndarray, batch: int, calls: int,
                 seconds: float = TIMING_S, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Median milliseconds per query of each search (a function of a batch of queries) over `calls` batches of
    `batch` queries (after one warm-up), fewer (3 at least) where they take more than `seconds` a search; the
    searches take turns call by call (which goes first rotates), so that all see the same load on a shared
    machine, and each timed call follows an untimed one of the same search on other queries, so that each is
    timed warm in the caches, as the process serving it alone sees it. `clock`: wall time by default."""
    def batch_at(start: int) -> np.ndarray:
        return np.ascontiguousarray(np.take(queries, np.arange(start, start + batch) % len(queries), axis=0))

    times: list[list[float]] = [[] for _ in searches]
    order = list(range(len(searches)))
    for c in range(calls + 1):
        x, warm = batch_at(c * batch), batch_at(c * batch + len(queries) // 2)
        for i in order[c % len(order):] + order[:c % len(order)]:
            searches[i](warm)
            start = clock()
            searches[i](x)
            times[i].append(clock() - start)
        if c >= 3 and sum(map(sum, times)) > seconds * len(searches):
            break
    return [1e3 * float(np.median(t[1:])) / batch for t in times]


def cpu_ms_per_query(searches: list[Callable[[np.ndarray], object]], queries: np.ndarray, batch: int,
                     calls: int) -> list[float]:
    """`ms_per_query` in CPU time with faiss on one thread: the work a query takes, which other processes
    on the machine hardly change (their load stretches wall time, and unevenly between structures)."""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        return ms_per_query(searches, queries, batch, calls, clock=time.process_time)
    finally:
        faiss.omp_set_num_threads(threads)


def searcher(index: faiss.Index, rerank: int, fetch: Callable[[np.ndarray], np.ndarray] | None,
             k: int = TUNE_K + 1) -> Callable[[np.ndarray], object]:
    """The search `build_index` times: k nearest, through a shortlist re-scored with `fetch`'s vectors when
    `rerank` is set."""
    if rerank:
        return lambda x: reranked(index, x, k, rerank, fetch)
    return lambda x: index.search(x, k)


def index_bytes_at(index: faiss.Index, n: int) -> int:
    """Bytes an index of this type takes with n vectors, HNSW links included."""
    inner = _inner(index)[0]
    links = n * 8 * inner.hnsw.nb_neighbors(1) if isinstance(inner, faiss.IndexHNSW) else 0
    return memory_bytes(index, n) + links


def read_ms(rerank: int) -> float:
    """Milliseconds a query spends reading its re-ranking shortlist from a gallery's LMDB (READ_US a vector)."""
    return shortlist(TUNE_K, rerank) * READ_US / 1e3 if rerank else 0.0


def _tuned(index: faiss.Index, vectors: np.ndarray, ids: np.ndarray, truth, target: float,
           give_up_ms: float | None = None) -> dict:
    """Tune an index to the target on the queries of `truth` (see `tune` for `give_up_ms`, here with the reads
    of a re-ranked shortlist counted in): its setting,
    shortlist (`rerank`, 0: none), recall, milliseconds per tuning query and `read_ms`. Lossy codes are tuned
    with each shortlist of RERANK, longest first (each from the setting the longer one met the target at), and keep
    the one meeting the target at the least time with its reads (else the highest recall)."""
    best: dict | None = None
    for rerank in RERANK if describe(index)["lossy"] else (0,):
        bound = None if give_up_ms is None else give_up_ms - read_ms(rerank)  # bounds search and reads together
        if best is not None and best["meets_target"]:  # this shortlist's search must beat the best one's
            bound = min(bound if bound is not None else math.inf,
                        best["tuning_ms"] + best["read_ms"] - read_ms(rerank))
        needed = next(iter(best["params"].values()), None) if best is not None and best["meets_target"] else None
        tuning = tune(index, vectors, ids, target=target, truth=truth, give_up_ms=bound, rerank=rerank,
                      at_least=needed)
        lower = tuning.get("recall_at_10_lower", tuning["recall_at_10"])
        row = {"params": tuning["params"], "rerank": rerank, "recall_at_10": tuning["recall_at_10"],
               "recall_at_10_lower": lower, "meets_target": lower >= target and not tuning.get("gave_up"),
               "queries": len(truth.rows), "tuning_ms": tuning.get("ms_per_query", 0.0), "read_ms": read_ms(rerank),
               "gave_up": tuning.get("gave_up", False)}
        if rerank:
            row["recall_at_10_raw"] = tuning.get("recall_at_10_raw", tuning["recall_at_10"])
        rank = (row["meets_target"], -row["tuning_ms"] - row["read_ms"] if row["meets_target"] else lower)
        if best is None or rank > (best["meets_target"], -best["tuning_ms"] - best["read_ms"] if best["meets_target"]
                                   else best["recall_at_10_lower"]):
            best = row
        if not row["meets_target"] and not row["gave_up"]:  # every list searched: a shorter list recalls less
            break
    for name, value in best["params"].items():  # a later shortlist's tuning left its own setting
        set_param(index, name, value)
    return best


def _timed(searches: list[Callable[[np.ndarray], object]], queries: np.ndarray) -> list[dict]:
    """Each search's milliseconds per query at batch 1 and 256, and its CPU milliseconds at batch 256 on one
    thread (what `pick` compares), the searches timed in turn."""
    single = ms_per_query(searches, queries, 1, TIMED_SINGLE)
    batched = ms_per_query(searches, queries, 256, TIMED_BATCHES)
    cpu = cpu_ms_per_query(searches, queries, 256, TIMED_BATCHES)
    return [{"ms_batch_1": round(a, 5), "ms_batch_256": round(b, 5), "cpu_ms_batch_256": round(c, 5)}
            for a, b, c in zip(single, batched, cpu)]


def tuned_report(built: faiss.Index, rows: np.ndarray, vectors: np.ndarray, ids: np.ndarray, choice: IndexChoice,
                 target_recall: float, seed: int, start: float) -> dict:
    """Tune `built` (the index of `choice` holding every vector, trained on `rows`) to the target on gallery
    vectors it was not trained on; its `build_index` report (`start`: when its build began)."""
    n, result = len(vectors), {"params": {}}
    if n > 1 and not describe(built)["exact"]:
        truth = tuning_queries(vectors, ids, np.setdiff1d(np.arange(n), rows), seed=seed)
        result = _tuned(built, vectors, ids, truth, target_recall)
        result.update(_timed([searcher(built, result["rerank"], vectors_by_id(vectors, ids))], truth.queries)[0])
        result.pop("gave_up")
    report = {"factory": choice.factory, "reason": choice.reason, **result, "candidates": [], "skipped": []}
    return _finish(report, built, n, target_recall, start)


def build_index(vectors: np.ndarray, ids: np.ndarray | None = None, *, target_recall: float = TARGET_RECALL,
                index: str = "auto", memory: int | None = None, device: str = "cpu",
                seed: int = 0) -> tuple[faiss.Index, dict]:
    """A tuned inner-product faiss index of L2-normalised `vectors` (under `ids`, default 0..n-1) and its
    report: with `index` auto the fastest candidate meeting recall@10 >= target_recall (lower 95%
    bound) against exact search (the simplest within SIMPLER_WITHIN of it; exact search alone up to
    EXACT_BYTES of vectors), else the named index or factory string, tuned to the target.

    vectors: N x dim float32, unit length (inner product is cosine similarity).
    ids: the 64-bit id of each row (default 0..N-1).
    target_recall: the recall@10 against exact search that the tuned setting reaches (its lower 95% bound).
    index: `auto`, `flat`, `ivf`, `ivfpq`, `hnsw` or a faiss factory string.
    memory: bytes the build may use; the index may take MEMORY_FRACTION of it, and when no float index fits,
        `auto` compares compressed codes that re-rank a shortlist with the float vectors (the report's
        `rerank`). None: the memory available now.
    device: `cpu`, or `gpu` to train, fill and tune on the GPUs faiss sees.
    seed: the random seed of training samples and tuning queries."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, dim = vectors.shape
    ids = np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
    start = time.perf_counter()
    if index.strip().lower() != "auto":
        choice = choose_index(n, dim, index, memory)
        built, rows = index_from_factory(vectors, ids, choice.factory, device, seed)
        return built, tuned_report(built, rows, vectors, ids, choice, target_recall, seed, start)
    truth = tuning_queries(vectors, ids, seed=seed) if n > 1 else None
    room = MEMORY_FRACTION * (memory if memory is not None else available_memory())
    rows, built, skipped, budget, reference, coarse = [], [], [], math.inf, None, {}
    fetch, planned = vectors_by_id(vectors, ids), candidates(n, dim, memory)
    for cand in planned:
        spent = time.perf_counter() - start
        estimate = pilot_seconds(vectors, cand.factory, seed) if cand.family == "hnsw" else 0.0
        why = (f"estimated {estimate:.0f} s, {max(budget - spent, 0):.0f} s of the {budget:.0f} s budget left"
               if cand.family == "hnsw" and spent + estimate > budget
               else f"{cand.bytes / 2**20:.1f} MiB, more than the memory left"
               if cand.bytes + sum(r["memory_bytes"] for r in rows) > room
               else None)
        if why:
            skipped.append({"factory": cand.factory, "reason": why})
            continue
        began = time.perf_counter()
        idx, _ = index_from_factory(vectors, ids, cand.factory, device, seed, exclude=truth.rows if truth else None,
                                    niter=NITER, shared=coarse)
        build_s = time.perf_counter() - began
        bound = min((PRUNE * (r["tuning_ms"] + r["read_ms"]) for r in rows if r["meets_target"]), default=None)
        result = _tuned(idx, vectors, ids, truth, target_recall, bound) if truth else {
            "params": {}, "rerank": 0, "read_ms": 0.0, "recall_at_10": 1.0, "recall_at_10_lower": 1.0,
            "meets_target": True, "gave_up": False}
        if result.pop("gave_up"):
            del idx  # freed before the next candidate is built
            (name, value), = result["params"].items()
            skipped.append({"factory": cand.factory, "reason": (
                f"built; at {name}={value} (recall@10 {result['recall_at_10']:.3f}) already over {PRUNE}x slower than "
                "the fastest candidate meeting the target, so not tuned further")})
            continue
        rows.append({"factory": cand.factory, "family": cand.family, **result, "build_s": round(build_s, 2),
                     "tune_s": round(time.perf_counter() - began - build_s, 2), "memory_bytes": index_bytes_at(idx, n)})
        built.append(idx)
        if reference is None:  # the budget: BUDGET x the first candidate's cost, tuning queries included
            reference = time.perf_counter() - start
            budget = max(BUDGET * reference, MIN_BUDGET_S)
    searches = [searcher(idx, row["rerank"], fetch) for idx, row in zip(built, rows)]
    timings = _timed(searches, truth.queries) if truth else [{"ms_batch_1": 0.0, "ms_batch_256": 0.0,
                                                                          "cpu_ms_batch_256": 0.0}]
    for row, timing in zip(rows, timings):
        row.update(timing)
        log.info("faiss: candidate %s", row)
    for row in skipped:
        log.info("faiss: candidate %s skipped: %s", row["factory"], row["reason"])
    winner, reason = pick(rows, target_recall)
    best = built[rows.index(winner)]
    built.clear()
    report = {k: winner[k] for k in ("factory", "params", "rerank", "read_ms", "recall_at_10", "recall_at_10_lower",
                                     "meets_target", "ms_batch_1", "ms_batch_256", "cpu_ms_batch_256", "build_s",
                                     "tune_s")}
    report["queries"] = winner.get("queries", 0)
    if winner["rerank"]:
        report["recall_at_10_raw"] = winner["recall_at_10_raw"]
    exact_only = [c.family for c in planned] == ["flat"]
    report.update(reason=_exact_only(n, dim) if exact_only else reason, candidates=rows,
                  skipped=skipped, budget_s=round(budget, 1) if reference else None,
                  reference_s=round(reference, 2) if reference else None)
    return best, _finish(report, best, n, target_recall, start)


def _finish(report: dict, index: faiss.Index, n: int, target: float, start: float) -> dict:
    """The report with the common fields: target, items, kind, memory, seconds."""
    report.setdefault("recall_at_10", 1.0)
    report.setdefault("recall_at_10_lower", report["recall_at_10"])
    report.setdefault("rerank", 0)
    report.update(target=target, items=n, dim=index.d, kind=describe(index)["kind"],
                  memory_bytes=index_bytes_at(index, n), total_s=round(time.perf_counter() - start, 2))
    if report["recall_at_10_lower"] < target:
        log.warning("faiss: %s reaches recall@10 %.3f (lower bound %.3f), below the target %.2f", report["factory"],
                    report["recall_at_10"], report["recall_at_10_lower"], target)
    return report


def _exact_only(n: int, dim: int) -> str:
    return (f"{n} vectors of {dim}-d take {n * dim * 4 / 2**20:.1f} MiB <= {EXACT_BYTES / 2**20:.0f} MiB (a query "
            "within 1 ms): exact search, the only candidate")


def current_reason(choice: dict, count: int) -> str | None:
    """Why a gallery of `count` vectors has its index, from the `choice` (reason, request, tuning.items and
    tuning.dim) made when it was built: items added or removed since are counted, not hidden behind the old size."""
    tuning = choice.get("tuning", {})
    built, dim = tuning.get("items"), tuning.get("dim")
    if built is None or built == count:
        return choice.get("reason")
    if choice.get("request") == "auto" and dim and max(built, count) * dim * 4 <= EXACT_BYTES:
        return _exact_only(count, dim)
    return (f"chosen for {built} vectors ({choice['reason']}), {count} now; `metricsearch index rebuild` "
            "chooses again for that size")


def simplicity(row: dict) -> tuple[int, int]:
    """How complex a candidate's structure is, for `pick`: its family's place in FAMILIES, then its bytes."""
    return FAMILIES.index(row.get("family", "ivf")), row["memory_bytes"]


def pick(rows: list[dict], target: float) -> tuple[dict, str]:
    """Among the candidates meeting the target, the simplest whose CPU time per query at batch 256 on one thread
    (measured, plus `read_ms` where it re-ranks) is within SIMPLER_WITHIN of the fastest's (none meets it: the
    highest lower recall bound), and why, in one line."""
    meeting = [r for r in rows if r["meets_target"]]
    if not meeting:
        best = max(rows, key=lambda r: r["recall_at_10_lower"])
        return best, f"no candidate reached recall@10 {target} (lower bound): the highest, {best['recall_at_10_lower']}"
    def ms(r: dict) -> float:  # measured, plus the modeled LMDB reads of a re-ranked shortlist
        return r["cpu_ms_batch_256"] + r.get("read_ms", 0.0)

    fastest = min(meeting, key=ms)
    if len(meeting) == 1:
        which = (f"the only one of the {len(rows)} candidates measured to the end that meets" if len(rows) > 1
                 else "the only candidate measured to the end, meeting")
        return fastest, (f"{which} recall@10 >= {target} (lower 95% bound): {ms(fastest) * 1e3:.1f} us/query (CPU "
                         "time at batch 256, one thread)")
    close = [r for r in meeting if ms(r) <= SIMPLER_WITHIN * ms(fastest)]
    best = min(close, key=simplicity)
    why = (f"the simplest within {SIMPLER_WITHIN:.2f}x of the fastest (CPU time at batch 256, one thread) among the "
           f"{len(meeting)} of {len(rows)} candidates meeting recall@10 >= {target} (lower 95% bound): "
           f"{ms(best) * 1e3:.1f} us/query")
    if best is not fastest:
        why += f" ({fastest['factory']}: {ms(fastest) * 1e3:.1f} us)"
    others = sorted((r for r in meeting if r is not best), key=ms)
    if others and best is fastest:
        ratio = ms(others[0]) / max(ms(best), 1e-9)
        why += f", {ratio:.2f}x faster than {others[0]['factory']}"
    return best, why


def candidate_lines(report: dict) -> list[str]:
    """One line per candidate of a build_index report: setting, recall, measured speed, the winner
    marked; then one per candidate skipped, with the reason."""
    out = []
    for r in report.get("candidates", []):
        params = ",".join(f"{k}={v}" for k, v in r["params"].items()) or "exact"
        params += f", re-ranking {r['rerank']}x (+{r['read_ms'] * 1e3:.0f} us of LMDB reads)" if r.get("rerank") else ""
        raw = f", {r['recall_at_10_raw']:.3f} without re-ranking" if r.get("rerank") else ""
        mark = "*" if r["factory"] == report["factory"] else " "
        # (indexes built before 2026-12-07 did not time CPU)
        cpu = f" ({r['cpu_ms_batch_256'] * 1e3:.1f} us of CPU on one thread)" if "cpu_ms_batch_256" in r else ""
        out.append(f"{mark}{r['factory']} {params}: recall@10 {r['recall_at_10']:.3f} "
                   f"(lower {r['recall_at_10_lower']:.3f}{raw}), "
                   f"{r['ms_batch_256'] * 1e3:.1f} us/query at batch 256{cpu}, "
                   f"{r['ms_batch_1'] * 1e3:.1f} us at batch 1, built in {r['build_s']:.1f} s")
    out += [f" {r['factory']}: skipped ({r['reason']})" for r in report.get("skipped", [])]
    return out
