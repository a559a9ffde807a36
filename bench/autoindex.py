"""The automatic index against autofaiss and swept structures: `metricsearch.index.build_index` (auto)
beside autofaiss's `build_index` (its defaults, and its time budget set to our per-query time) and
HNSW32 / IVF-Flat swept over efSearch / nprobe, on clustered 128-d unit vectors and 2,000 new queries.

    python bench/autoindex.py                       # 100k and 1M (about 15 minutes on 2 idle CPU cores)
    python bench/autoindex.py --sizes 100000        # 100k only

autofaiss is a bench-only dependency, installed beside the project (it pins numpy < 2, so by hand):
`pip install --no-deps autofaiss==2.18.0 embedding_reader fire termcolor`; without it its rows are
skipped with a message. Writes bench/results/autoindex.md and .json; recall@10 is against exact search.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import faiss
import numpy as np

from metricsearch.index import build_index
from metricsearch.index.autoindex import candidates, growth, index_bytes_at, ms_per_query
from metricsearch.index.faiss_index import build_index as build_factory, ivf_lists, recall_without_self, set_param, tune

sys.path.insert(0, str(Path(__file__).parent))
from index import clustered  # noqa: E402  (the vectors of bench/index.py)

RESULTS = Path(__file__).with_name("results")
K = 10
SWEEP = {"IDMap,HNSW32": ("efSearch", [10, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]),
         "IVF,Flat": ("nprobe", [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256])}


def measure(index: faiss.Index, queries: np.ndarray, exact: np.ndarray, n: int) -> dict:
    """recall@10 against exact on the queries, QPS at batch 256 (median call), p50 ms at batch 1, memory."""
    found = index.search(queries, K)[1]
    return {"recall_at_10": recall_without_self(found, exact, np.full(len(queries), -1), K),
            "qps_256": 1e3 / ms_per_query(index, queries, 256, 8, seconds=4.0),
            "p50_ms_1": ms_per_query(index, queries, 1, 300, seconds=4.0),
            "memory_mb": index_bytes_at(index, n) / 1e6}


def run_autofaiss(vectors: np.ndarray, queries: np.ndarray, exact: np.ndarray, budget_ms: float | None) -> dict | None:
    """autofaiss.build_index with its defaults (budget None) or with k=10 and `budget_ms` per query."""
    try:
        import autofaiss
    except ImportError as exc:
        print(f"autofaiss rows skipped: it is not importable ({exc}); see this file's docstring", file=sys.stderr)
        return None
    args = {} if budget_ms is None else {"max_index_query_time_ms": budget_ms, "min_nearest_neighbors_to_retrieve": K}
    start = time.perf_counter()
    index, infos = autofaiss.build_index(vectors, save_on_disk=False, metric_type="ip", verbose=logging.WARNING,
                                         current_memory_available="16G", **args)
    build_s = time.perf_counter() - start
    faiss.omp_set_num_threads(os.cpu_count())  # autofaiss may leave it changed
    return {"index": infos.get("index_key"), "params": infos.get("index_param"), "build_s": build_s,
            **measure(index, queries, exact, len(vectors))}


def sweep(factory: str, vectors: np.ndarray, queries: np.ndarray, exact: np.ndarray) -> dict:
    """One index, built once, measured at every value of its search parameter."""
    n = len(vectors)
    factory = factory.replace("IVF,", f"IVF{ivf_lists(n)},")
    start = time.perf_counter()
    index, rows = build_factory(vectors, np.arange(n, dtype=np.int64), factory)
    build_s = time.perf_counter() - start
    name, values = SWEEP[factory if factory.startswith("IDMap") else "IVF,Flat"]
    tune_s = None
    if name == "nprobe":  # IVF-Flat with these lists was the `auto` choice before: its build + tune, for the cost
        start = time.perf_counter()
        tune(index, vectors, np.arange(n, dtype=np.int64), np.setdiff1d(np.arange(n), rows))
        tune_s = time.perf_counter() - start
    points = []
    for value in values:
        if name == "nprobe" and value > faiss.extract_index_ivf(index).nlist:
            break
        set_param(index, name, value)
        points.append({"value": value, **measure(index, queries, exact, n)})
        if points[-1]["recall_at_10"] > 0.995:
            break
    return {"index": factory, "param": name, "build_s": build_s, "tune_s": tune_s, "points": points}


def bench(n: int) -> dict:
    vectors = clustered(n, n // 50)
    queries = clustered(2000, n // 50, draw=99)  # new vectors of the same distribution
    exact = faiss.knn(queries, vectors, K, metric=faiss.METRIC_INNER_PRODUCT)[1]
    out: dict = {"n": n, "load_before": os.getloadavg()}
    start = time.perf_counter()
    index, report = build_index(vectors)
    out["auto"] = {"index": report["factory"], "params": report["params"], "build_s": time.perf_counter() - start,
                   "report": report, **measure(index, queries, exact, n)}
    del index
    print(json.dumps({"n": n, "auto": {k: v for k, v in out["auto"].items() if k != "report"}}), flush=True)
    out["sweeps"] = [sweep(f, vectors, queries, exact) for f in SWEEP]
    print(json.dumps({"n": n, "sweeps": out["sweeps"]}), flush=True)
    out["autofaiss_defaults"] = run_autofaiss(vectors, queries, exact, None)
    out["autofaiss_budget"] = run_autofaiss(vectors, queries, exact, 1e3 / out["auto"]["qps_256"])
    out["load_after"] = os.getloadavg()
    print(json.dumps({k: out[k] for k in ("autofaiss_defaults", "autofaiss_budget", "load_after")}), flush=True)
    return out


def best_swept(result: dict, recall: float) -> dict | None:
    """The fastest swept point (any structure) at recall@10 >= `recall`."""
    points = [{"index": s["index"], "param": s["param"], **p} for s in result["sweeps"] for p in s["points"]
              if p["recall_at_10"] >= recall]
    return max(points, key=lambda p: p["qps_256"]) if points else None


def first_at(sweep_: dict, recall: float) -> dict | None:
    """A sweep's smallest setting reaching `recall`."""
    return next((p for p in sweep_["points"] if p["recall_at_10"] >= recall), None)


def table(results: list[dict]) -> str:
    lines = ["| N | method | index | setting | build + tune (s) | recall@10 | QPS batch 256 | p50 batch 1 (ms) | memory (MB) |",
             "|---:|---|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        rows = [("metricsearch auto", r["auto"]), ("autofaiss defaults", r["autofaiss_defaults"]),
                ("autofaiss, k=10, our time as budget", r["autofaiss_budget"])]
        for name, m in rows:
            if m is None:
                lines.append(f"| {r['n']:,} | {name} | not run: autofaiss is not installed | | | | | | |")
                continue
            params = m["params"] if isinstance(m["params"], str) else ",".join(f"{k}={v}" for k, v in m["params"].items())
            lines.append(f"| {r['n']:,} | {name} | {m['index']} | {params or 'exact'} | {m['build_s']:.0f} | "
                         f"{m['recall_at_10']:.3f} | {m['qps_256']:,.0f} | {m['p50_ms_1']:.3f} | {m['memory_mb']:.0f} |")
        for s in r["sweeps"]:
            for p in s["points"]:
                if p["recall_at_10"] >= 0.9:
                    lines.append(f"| {r['n']:,} | swept | {s['index']} | {s['param']}={p['value']} | {s['build_s']:.0f} (build) | "
                                 f"{p['recall_at_10']:.3f} | {p['qps_256']:,.0f} | {p['p50_ms_1']:.3f} | {p['memory_mb']:.0f} |")
    lines += ["", "| N | our recall@10 | best swept at equal or better recall | our QPS / its QPS | "
              "our QPS / autofaiss defaults' (its recall) | load (1-min avg) before / after |", "|---:|---:|---|---:|---:|---|"]
    for r in results:
        ours = r["auto"]
        best = best_swept(r, ours["recall_at_10"])
        swept = f"{best['index']} {best['param']}={best['value']}: {best['recall_at_10']:.3f}, {best['qps_256']:,.0f} QPS" if best else "none"
        d = r["autofaiss_defaults"]
        vs_af = f"{ours['qps_256'] / d['qps_256']:.1f}x ({d['recall_at_10']:.3f})" if d else "autofaiss not installed"
        ratio = f"**{ours['qps_256'] / best['qps_256']:.2f}x**" if best else "-"
        lines.append(f"| {r['n']:,} | {ours['recall_at_10']:.3f} | {swept} | {ratio} | {vs_af} | "
                     f"{r['load_before'][0]:.1f} / {r['load_after'][0]:.1f} |")
    lines += ["", "| N | `auto`: comparing candidates (s) | building + tuning the winner (s) | total (s) | "
              "before (IVF-Flat by rule): build + tune (s) | total / before |", "|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        report, ivf = r["auto"]["report"], next(s for s in r["sweeps"] if s["param"] == "nprobe")
        before = ivf["build_s"] + ivf["tune_s"]
        lines.append(f"| {r['n']:,} | {report['choice_s']:.0f} | {report['final_build_s']:.0f} | {r['auto']['build_s']:.0f} | "
                     f"{before:.0f} | {r['auto']['build_s'] / before:.1f}x |")
    lines += ["", "Prediction from the sample (`auto` at N > 100,000 compares candidates on 100,000 vectors): "
              "predicted vs measured microseconds per query at batch 256 (measured: the winner built on all N and "
              "tuned there; the swept structures at their first setting with recall@10 >= 0.95 on the new queries).", "",
              "| N | candidate | setting on the sample | recall@10 on the sample (lower bound) | predicted us/query | measured us/query |",
              "|---:|---|---|---:|---:|---:|"]
    for r in results:
        report = r["auto"]["report"]
        for c in report["candidates"]:
            measured = "-"
            if c["factory"] == report["factory"]:
                measured = f"{report['ms_batch_256'] * 1e3:.1f} (chosen)"
            for s in r["sweeps"]:
                point = first_at(s, 0.95)
                if s["index"] == c["factory"] and point and c["factory"] != report["factory"]:
                    measured = f"{1e6 / point['qps_256']:.1f} ({s['param']}={point['value']})"
            params = ",".join(f"{k}={v}" for k, v in c["params"].items()) or "exact"
            lines.append(f"| {r['n']:,} | {c['factory']} | {c['sample_factory']} {params} | {c['recall_at_10']:.3f} "
                         f"({c['recall_at_10_lower']:.3f}) | {c['predicted_ms_batch_256'] * 1e3:.1f} | {measured} |")
    ten = candidates(10_000_000, 128, memory=2**40)
    lines += ["", f"10,000,000: not run (an HNSW32 build alone would take hours on 2 cores). The candidates would be "
              f"{', '.join(c.factory for c in ten)}; from the 1M sample, HNSW's time per query would grow "
              f"{growth('hnsw', 1_000_000, 10_000_000):.2f}x and IVF's {growth('ivf', 1_000_000, 10_000_000):.0f}x "
              "at the same share of lists probed (extrapolated, not measured)."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000], help="gallery sizes")
    args = parser.parse_args()
    results = [bench(n) for n in args.sizes]
    text = table(results)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "autoindex.md").write_text(text + "\n")
    (RESULTS / "autoindex.json").write_text(json.dumps(results, indent=1, default=float))


if __name__ == "__main__":
    main()
