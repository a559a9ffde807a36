"""The automatic index against autofaiss and swept structures: `metricsearch.index.build_index` (auto)
beside autofaiss's `build_index` (its defaults, and its time budget set to our per-query time) and
HNSW32 / IVF-Flat / IVF-HNSW swept over efSearch / nprobe (IVF at the rule's list count and at 16 sqrt(N),
as an outside check did; IVF-HNSW at 16 sqrt(N) and N/64 lists), on clustered 128-d unit vectors and 10,000
new queries (recall@10 within about +-0.003 at 95%; with 2,000, +-0.008 made the verdict at 0.95 a coin toss),
from two generators: `uniform` (bench/gallery_speed.py's: classes of 50, spreads 0.3-0.9) and
`pareto` (class sizes from a Pareto law, a few huge and many tiny, spreads log-uniform 0.2-0.8: data `auto` was not
tuned on). The ratio table says, per generator and size, `auto`'s QPS at batch 256 over the best swept
setting at equal or better recall@10.

    python bench/autoindex.py                                       # both generators, 10k to 2M: hours
    python bench/autoindex.py --sizes 10000 100000 300000           # about 10 minutes a generator, 2 busy cores
    python bench/autoindex.py --sizes 1000000 --generators pareto   # about 15 minutes on 2 idle cores
    python bench/autoindex.py --sizes 2000000 --generators pareto   # about 40 minutes
    python bench/autoindex.py --sizes 2000000 --generators uniform --swept IVF8192,Flat IVF32768_HNSW32,Flat
        # `auto` again, against only the structures a full run found fastest at 0.95 (each sweep builds its index)

autofaiss is a bench-only dependency, installed beside the project (it pins numpy < 2, so by hand):
`pip install --no-deps autofaiss==2.18.0 embedding_reader fire termcolor`; without it its rows are
skipped with a message. Writes bench/results/<--out>.md and .json (default autoindex); recall@10 is against
exact search.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import math
import sys
import time
from pathlib import Path

import faiss
import numpy as np

from metricsearch.index import build_index
from metricsearch.index.autoindex import HNSW_QUANTIZER_POINTS, candidates, index_bytes_at
from metricsearch.index.faiss_index import index_from_factory, ivf_lists, recall_without_self, set_param, tune

sys.path.insert(0, str(Path(__file__).parent))
from gallery_speed import clustered  # noqa: E402  (the vectors of bench/gallery_speed.py)
from results_files import write_results  # noqa: E402

RESULTS = Path(__file__).with_name("results")
K = 10
QUERIES = 10_000  # new queries scoring every row (rows before 2026-12-07 used 2,000)
EF_SEARCH = [10, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]
NPROBE = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]


def pareto_clustered(n: int, clusters: int, dim: int = 128, draw: int = 0, alpha: float = 1.2) -> np.ndarray:
    """Unit vectors around `clusters` random centres whose sizes follow a Pareto law (weights 1 + Pareto(alpha):
    a few classes of thousands, most of a handful) and whose spreads per dimension are log-uniform in 0.2-0.8
    (a mean cosine within a class of about 0.6 to 0.96); `draw` takes another sample."""
    fixed = np.random.default_rng(54321)
    centres = fixed.normal(size=(clusters, dim)).astype(np.float32)
    weights = fixed.pareto(alpha, clusters) + 1.0
    spreads = np.exp(fixed.uniform(np.log(0.2), np.log(0.8), clusters)).astype(np.float32)
    rng = np.random.default_rng(draw + 1)
    x = np.empty((n, dim), np.float32)
    for start in range(0, n, 100_000):  # in chunks: a few hundred MB at 1M, not gigabytes
        c = rng.choice(clusters, min(100_000, n - start), p=weights / weights.sum())
        part = centres[c] + spreads[c, None] * rng.standard_normal((len(c), dim), dtype=np.float32)
        x[start:start + len(c)] = part / np.linalg.norm(part, axis=1, keepdims=True)
    return x


GENERATORS = {"uniform": clustered, "pareto": pareto_clustered}


def swept_factories(n: int) -> list[str]:
    """What is swept at n: HNSW32; IVF-Flat at the rule's lists and, below 500k, at 16 sqrt(N) (flat k-means over
    more lists takes hours above); IVF with an HNSW quantizer at 16 sqrt(N) and N / 64 lists (powers of two)."""
    wide, per_64 = 2 ** round(math.log2(16 * math.sqrt(n))), 2 ** round(math.log2(n / HNSW_QUANTIZER_POINTS))
    flat = [ivf_lists(n)] + ([int(16 * math.sqrt(n))] if n < 500_000 else [])
    return (["IDMap,HNSW32"] + [f"IVF{c},Flat" for c in dict.fromkeys(flat)]
            + [f"IVF{c}_HNSW32,Flat" for c in dict.fromkeys([wide, per_64]) if c <= n // 16])


def recall(index: faiss.Index, queries: np.ndarray, exact: np.ndarray) -> float:
    """recall@10 of an index against exact search on new queries."""
    return recall_without_self(index.search(queries, K)[1], exact, np.full(len(queries), -1), K)


def timed_in_turn(entries: list[dict], queries: np.ndarray, rounds_256: tuple[int, int] = (6, 24),
                  rounds_1: int = 150, seconds: float = 1.5) -> None:
    """QPS at batch 256 and p50 ms at batch 1 of every (index, setting), median call, all taking turns
    call by call (which goes first rotates), so that all see the same load on this shared machine. Each timed
    call follows an untimed one of the same entry on other queries: an index is timed warm, as a process that
    serves it sees it, not cold in the caches after another index's turn (which slowed the first entry of each
    index, `auto`'s always among them). Batches of 256: from 6 to 24 rounds, fewer where an entry's calls
    took more than `seconds` (6 left two builds of one structure and setting 12% apart at uniform 300k)."""
    def batch_at(start: int, batch: int) -> np.ndarray:
        return np.ascontiguousarray(np.take(queries, np.arange(start, start + batch) % len(queries), axis=0))

    for batch, (least, most), key in ((256, rounds_256, "qps_256"), (1, (rounds_1, rounds_1), "p50_ms_1")):
        times: list[list[float]] = [[] for _ in entries]
        for r in range(most + 1):
            if r > least and sum(map(sum, times)) > seconds * len(entries):
                break
            x, warm = batch_at(r * batch, batch), batch_at(r * batch + len(queries) // 2, batch)
            for i in [*range(r % len(entries), len(entries)), *range(r % len(entries))]:
                e = entries[i]
                if e.get("param"):
                    set_param(e["object"], e["param"], e["value"])
                e["object"].search(warm, K)
                start = time.perf_counter()
                e["object"].search(x, K)
                times[i].append(time.perf_counter() - start)
        for e, t in zip(entries, times):
            median = float(np.median(t[1:]))
            e[key] = batch / median if batch > 1 else 1e3 * median


def run_autofaiss(vectors: np.ndarray, budget_ms: float) -> tuple[dict | None, dict | None]:
    """autofaiss.build_index with its defaults, and the same index tuned again by autofaiss.tune_index
    with k=10 and `budget_ms` per query (what build_index with those arguments does after building)."""
    try:
        import autofaiss
    except ImportError as exc:
        print(f"autofaiss rows skipped: it is not importable ({exc}); see this file's docstring", file=sys.stderr)
        return None, None
    start = time.perf_counter()
    index, infos = autofaiss.build_index(vectors, save_on_disk=False, metric_type="ip", verbose=logging.WARNING)
    build_s = time.perf_counter() - start
    defaults = {"index": infos["index_key"], "params": infos["index_param"], "build_s": build_s, "object": index,
                "memory_mb": index_bytes_at(index, len(vectors)) / 1e6}
    start = time.perf_counter()
    again = autofaiss.tune_index(faiss.clone_index(index), infos["index_key"], save_on_disk=False,
                                 verbose=logging.WARNING, min_nearest_neighbors_to_retrieve=K,
                                 max_index_query_time_ms=budget_ms)
    tune_s = time.perf_counter() - start
    inner = faiss.downcast_index(again)
    param = f"efSearch={inner.hnsw.efSearch}" if isinstance(inner, faiss.IndexHNSW) else "(autofaiss's)"
    budget = {"index": infos["index_key"], "params": param, "build_s": build_s + tune_s, "object": again,
              "memory_mb": defaults["memory_mb"], "note": f"build shared with the defaults' run, tuning {tune_s:.0f} s"}
    faiss.omp_set_num_threads(os.cpu_count())  # autofaiss may leave it changed
    return defaults, budget


def sweep(factory: str, vectors: np.ndarray, queries: np.ndarray, exact: np.ndarray) -> dict:
    """One index built on its own, its recall at each value of its search parameter up to recall 0.995;
    IVF-Flat at the rule's lists is also tuned as `auto` did before it measured candidates (its cost)."""
    n = len(vectors)
    start = time.perf_counter()
    index, rows = index_from_factory(vectors, np.arange(n, dtype=np.int64), factory)
    build_s = time.perf_counter() - start
    name, values = ("efSearch", EF_SEARCH) if factory.startswith("IDMap") else ("nprobe", NPROBE)
    tune_s = None
    if factory == f"IVF{ivf_lists(n)},Flat":
        start = time.perf_counter()
        tune(index, vectors, np.arange(n, dtype=np.int64), np.setdiff1d(np.arange(n), rows))
        tune_s = time.perf_counter() - start
    points = []
    for value in values:
        if name == "nprobe" and value > faiss.extract_index_ivf(index).nlist:
            break
        set_param(index, name, value)
        points.append({"value": value, "recall_at_10": recall(index, queries, exact), "object": index, "param": name})
        if points[-1]["recall_at_10"] > 0.995:
            break
    return {"index": factory, "param": name, "build_s": build_s, "tune_s": tune_s,
            "memory_mb": index_bytes_at(index, n) / 1e6, "points": points}


def bench(n: int, generator: str, swept: list[str] | None = None) -> dict:
    vectors = GENERATORS[generator](n, n // 50)
    queries = GENERATORS[generator](QUERIES, n // 50, draw=99)  # new vectors of the same distribution
    exact = faiss.knn(queries, vectors, K, metric=faiss.METRIC_INNER_PRODUCT)[1]
    out: dict = {"n": n, "generator": generator, "load_before": os.getloadavg()}
    start = time.perf_counter()
    index, report = build_index(vectors)
    out["auto"] = {"index": report["factory"], "params": report["params"], "build_s": time.perf_counter() - start,
                   "report": report, "object": index, "memory_mb": index_bytes_at(index, n) / 1e6}
    print(json.dumps({"n": n, "auto": {k: v for k, v in out["auto"].items() if k not in ("report", "object")}}),
          flush=True)
    (name, value), = report["params"].items() or [(None, None)]
    out["auto"].update(param=name, value=value)  # set again before each timed call: a sweep may share the index
    out["sweeps"] = [sweep(f, vectors, queries, exact) for f in swept or swept_factories(n)]
    # autofaiss's budget: our per-query time at batch 256
    out["autofaiss_defaults"], out["autofaiss_budget"] = run_autofaiss(vectors, report["ms_batch_256"])
    entries = [e for e in (out["auto"], out["autofaiss_defaults"], out["autofaiss_budget"]) if e]
    for e in entries:
        if e.get("param"):
            set_param(e["object"], e["param"], e["value"])
        e["recall_at_10"] = recall(e["object"], queries, exact)
    points = [p for s in out["sweeps"] for p in s["points"] if p["recall_at_10"] >= 0.9]
    timed_in_turn(entries + points, queries)
    for e in entries + [p for s in out["sweeps"] for p in s["points"]]:
        e.pop("object")
    out["load_after"] = os.getloadavg()
    shown = {**out, "auto": {k: v for k, v in out["auto"].items() if k != "report"}}
    print(json.dumps(shown, default=float), flush=True)
    return out


def best_swept(result: dict, recall: float) -> dict | None:
    """The fastest swept point (any structure) at recall@10 >= `recall`."""
    points = [{"index": s["index"], **p} for s in result["sweeps"] for p in s["points"]
              if p["recall_at_10"] >= recall and "qps_256" in p]
    return max(points, key=lambda p: p["qps_256"]) if points else None


def first_at(sweep_: dict, recall: float) -> dict | None:
    """A sweep's smallest setting reaching `recall`."""
    return next((p for p in sweep_["points"] if p["recall_at_10"] >= recall and "qps_256" in p), None)


def label(r: dict) -> str:
    """A result's row name: its generator and size."""
    return f"{r['generator']} {r['n']:,}"


def table(results: list[dict]) -> str:
    lines = ["| data, N | method | index | setting | build + tune (s) | recall@10 | QPS batch 256 | p50 batch 1 (ms) | "
             "memory (MB) |",
             "|---:|---|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        rows = [("metricsearch auto", r["auto"]), ("autofaiss defaults", r["autofaiss_defaults"]),
                ("autofaiss, k=10, our time as budget", r["autofaiss_budget"])]
        for name, m in rows:
            if m is None:
                lines.append(f"| {label(r)} | {name} | not run: autofaiss is not installed | | | | | | |")
                continue
            params = (m["params"] if isinstance(m["params"], str)
                      else ",".join(f"{k}={v}" for k, v in m["params"].items()))
            lines.append(f"| {label(r)} | {name} | {m['index']} | {params or 'exact'} | {m['build_s']:.0f} | "
                         f"{m['recall_at_10']:.3f} | {m['qps_256']:,.0f} | {m['p50_ms_1']:.3f} | "
                         f"{m['memory_mb']:.0f} |")
        for s in r["sweeps"]:
            for p in s["points"]:
                if "qps_256" in p:
                    lines.append(f"| {label(r)} | swept | {s['index']} | {s['param']}={p['value']} | "
                                 f"{s['build_s']:.0f} (build) | {p['recall_at_10']:.3f} | {p['qps_256']:,.0f} | "
                                 f"{p['p50_ms_1']:.3f} | {s['memory_mb']:.0f} |")
    lines += ["", "| data, N | our recall@10 | best swept at equal or better recall | our QPS / its QPS | "
              "best swept at recall@10 >= 0.95: our QPS / its | our QPS / autofaiss defaults' (its recall) | "
              "load (1-min avg) before / after |",
              "|---:|---:|---|---:|---|---:|---|"]
    for r in results:
        ours = r["auto"]
        best = best_swept(r, ours["recall_at_10"])
        swept = (f"{best['index']} {best['param']}={best['value']}: {best['recall_at_10']:.3f}, "
                 f"{best['qps_256']:,.0f} QPS" if best else "none")
        d = r["autofaiss_defaults"]
        vs_af = f"{ours['qps_256'] / d['qps_256']:.1f}x ({d['recall_at_10']:.3f})" if d else "autofaiss not installed"
        ratio = f"**{ours['qps_256'] / best['qps_256']:.2f}x**" if best else "- (none swept reaches it)"
        floor = best_swept(r, 0.95)
        at_floor = (f"{floor['index']} {floor['param']}={floor['value']} ({floor['recall_at_10']:.3f}): "
                    f"{ours['qps_256'] / floor['qps_256']:.2f}x" if floor else "none")
        lines.append(f"| {label(r)} | {ours['recall_at_10']:.3f} | {swept} | {ratio} | {at_floor} | {vs_af} | "
                     f"{r['load_before'][0]:.1f} / {r['load_after'][0]:.1f} |")
    lines += ["", "| data, N | `auto`: first candidate, build + tune (s) | its budget (s) | `auto` in all (s) | "
              "before (IVF-Flat by rule, faiss's k-means): build + tune (s) | `auto` / before |",
              "|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        report, ivf = r["auto"]["report"], next(s for s in r["sweeps"] if s["tune_s"] is not None)
        before = ivf["build_s"] + ivf["tune_s"]
        if report["reference_s"] is None:  # exact search alone: nothing compared
            lines.append(f"| {label(r)} | exact search alone | | {r['auto']['build_s']:.0f} | "
                         f"{before:.0f} | **{r['auto']['build_s'] / before:.1f}x** |")
            continue
        lines.append(f"| {label(r)} | {report['reference_s']:.0f} | {report['budget_s']:.0f} | "
                     f"{r['auto']['build_s']:.0f} | {before:.0f} | **{r['auto']['build_s'] / before:.1f}x** |")
    lines += ["", "`auto`'s candidates, each built on all N and tuned on 4,000 gallery vectors held out of training "
              "(recall@10 with its lower 95% bound), timed in turn on this machine; * the choice:", "",
              "| data, N | candidate | setting | recall@10 (lower bound) | us/query batch 256 | us batch 1 | "
              "build (s) |",
              "|---:|---|---|---:|---:|---:|---:|"]
    for r in results:
        report = r["auto"]["report"]
        for c in report["candidates"]:
            mark = "*" if c["factory"] == report["factory"] else ""
            params = ",".join(f"{k}={v}" for k, v in c["params"].items()) or "exact"
            lines.append(f"| {label(r)} | {mark}{c['factory']} | {params} | "
                         f"{c['recall_at_10']:.3f} ({c['recall_at_10_lower']:.3f}) | "
                         f"{c['ms_batch_256'] * 1e3:.1f} | {c['ms_batch_1'] * 1e3:.1f} | {c['build_s']:.0f} |")
        for c in report["skipped"]:
            lines.append(f"| {label(r)} | {c['factory']} | skipped: {c['reason']} | | | | |")
    ten = candidates(10_000_000, 128, memory=2**40)
    lines += ["", f"10,000,000: not run (float32 vectors alone take 5.1 GB, and one build of the IVF candidates about "
              f"10x the 1M time on 2 cores). The candidates would be {', '.join(c.factory for c in ten)}; the HNSW "
              "ones would be skipped by the time budget as at 1M."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000, 300_000, 1_000_000, 2_000_000],
                        help="gallery sizes")
    parser.add_argument("--generators", nargs="*", choices=list(GENERATORS), default=list(GENERATORS),
                        help="the vectors: uniform (bench/gallery_speed.py's classes) and pareto (uneven sizes and "
                             "spreads)")
    parser.add_argument("--swept", nargs="*", metavar="FACTORY",
                        help="sweep only these faiss factory strings (default: HNSW32, IVF-Flat and IVF-HNSW at the "
                             "list counts of `swept_factories`); IVF-Flat at the rule's lists must be among them (its "
                             "tuning is the 'before' column)")
    parser.add_argument("--out", default="autoindex", help="results file name under bench/results (.md, .json)")
    args = parser.parse_args()
    results = [bench(n, generator, args.swept) for generator in args.generators for n in args.sizes]
    text = table(results)
    print(text)
    write_results(RESULTS / args.out, text, json.loads(json.dumps(results, default=float)))


if __name__ == "__main__":
    main()
