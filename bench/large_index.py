"""Galleries larger than memory, in one run: N synthetic 256-d unit vectors in uneven clusters (bench/autoindex.py's
`pareto` generator: Pareto class sizes, spreads 0.2-0.8) written to a gallery's LMDB through the real writer, then
for each memory budget (`--budgets`, GB; `none`: what the machine has) the faiss index that `auto` builds within it
(what `index build --index-memory` runs: a child process reads the vectors from the LMDB and builds, tunes and saves
the index), and for each way of opening it (loaded, memory-mapped) a serving child process (`Gallery.open`) that
answers 2,000 new queries. Per row: the choice, build time and peak RSS of the build, index bytes per item,
recall@10 against exact search with the re-ranking of lossy codes and without it (the same index, its codes' own
order), QPS at batch 1 and 256 through `Gallery.search` (median call), and the serving process's peak RSS and its
anonymous (not file-backed) memory at the end. Writes bench/results/<--out>.md and .json.

    python bench/large_index.py --size 200000 --budgets none 0.15 --out large_index_200k   # a check: ~15 minutes
    python bench/large_index.py --size 1000000 --budgets none 4                             # the 1M row: ~1-2 hours
    python bench/large_index.py --size 10000000 --budgets none 4 --out large_index_10m      # 10M: not run yet

Timings are on whatever else the machine runs: the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import faiss
import numpy as np

from metricsearch.index import Gallery, build_index
from metricsearch.index.faiss_files import index_bytes
from metricsearch.index.faiss_index import recall_without_self
from metricsearch.index.jobs import build_faiss
from metricsearch.index.lmdb_store import Store
from metricsearch.models.memory_budget import resident_bytes

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from autoindex import pareto_clustered  # noqa: E402
from gallery_speed import synthetic_gallery  # noqa: E402
from onnx_models import pixel_correlation_onnx  # noqa: E402
from results_files import write_results  # noqa: E402

RESULTS = Path(__file__).with_name("results")
DIM, SIDE = 256, 16  # a 16 x 16 grey pixel model embeds 256-d (queries here are vectors; the model is never run)
QUERIES, K = 2_000, 10
GB = 2**30


def child_build(db: Path, budget: float | None) -> dict:
    """In a child process: build, tune and save `auto`'s index within `budget` GB, as `index build` does."""
    start = time.perf_counter()
    with Store.opened(db, writable=True) as store:
        header = build_faiss(store, db, "auto", "cpu",
                             build=partial(build_index, memory=None if budget is None else int(budget * GB)))
    choice = header["choice"]
    return {"factory": choice["factory"], "params": choice["params"], "rerank": choice["rerank"],
            "reason": choice["reason"], "build_s": time.perf_counter() - start,
            "build_peak_rss": resident_bytes("VmHWM"),
            "faiss_bytes": index_bytes(db), "candidates": len(choice["candidates"]), "skipped": choice["skipped"]}


def median_qps(gallery: Gallery, queries: np.ndarray, batch: int, calls: int, seconds: float = 20.0) -> float:
    """Queries per second of `gallery.search` at `batch`: the median of up to `calls` calls (one warm-up first)."""
    times: list[float] = []
    for c in range(calls + 1):
        x = np.ascontiguousarray(np.take(queries, np.arange(c * batch, (c + 1) * batch) % len(queries), axis=0))
        start = time.perf_counter()
        gallery.search(x, K)
        times.append(time.perf_counter() - start)
        if c >= 3 and sum(times) > seconds:
            break
    return batch / float(np.median(times[1:]))


def child_serve(db: Path, work: Path, mmap: bool) -> dict:
    """In a child process: open the gallery (memory-mapped or loaded), measure recall and QPS, report memory."""
    queries, exact = np.load(work / "queries.npy"), np.load(work / "exact.npy")
    start = time.perf_counter()
    with Gallery.open(db, device="cpu", mmap=mmap) as gallery:
        open_s = time.perf_counter() - start
        found = np.stack([np.pad(h.ids, (0, K - len(h.ids)), constant_values=-1) for h in gallery.search(queries, K)])
        raw = gallery._state.index.search(queries, K)[1]  # the codes' own order, no re-ranking
        out = {"mmap": gallery.info()["index_mmap"], "open_s": open_s,
               "recall": recall_without_self(found, exact, np.full(len(queries), -1), K),
               "recall_raw": recall_without_self(raw, exact, np.full(len(queries), -1), K),
               "qps_1": median_qps(gallery, queries, 1, 1000), "qps_256": median_qps(gallery, queries, 256, 8)}
    anon = next((int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                 if line.startswith("RssAnon:")), None)
    return {**out, "serve_peak_rss": resident_bytes("VmHWM"), "serve_rss_anon": anon}


def in_child(*args: str) -> dict:
    """Run this file with `args` in a fresh Python process (its own peak RSS); its last line is a JSON object."""
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"child {args[:2]} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench(n: int, budgets: list[float | None], work: Path) -> list[dict]:
    start = time.perf_counter()
    vectors = pareto_clustered(n, n // 50, dim=DIM)
    queries = pareto_clustered(QUERIES, n // 50, dim=DIM, draw=99)
    np.save(work / "queries.npy", queries)
    np.save(work / "exact.npy", faiss.knn(queries, vectors, K, metric=faiss.METRIC_INNER_PRODUCT)[1])
    db = work / "gallery"
    synthetic_gallery(db, vectors, pixel_correlation_onnx(work / "model.onnx", size=SIDE, channels=1), index=False)
    del vectors
    with Store.opened(db) as store:
        lmdb_bytes = store.used_bytes()
    print(json.dumps({"n": n, "written_s": time.perf_counter() - start, "lmdb_bytes": lmdb_bytes}), flush=True)
    rows = []
    for budget in budgets:
        built = {"n": n, "budget_gb": budget, "lmdb_bytes": lmdb_bytes, "load_before": os.getloadavg(),
                 **in_child("--child", "build", str(db), str(budget))}
        print(json.dumps(built), flush=True)
        for mmap in (False, True):
            row = {**built, **in_child("--child", "serve", str(db), str(work), str(mmap)),
                   "load_after": os.getloadavg()}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| N | budget | `auto`'s index (setting) | build (s) | build peak RSS (GB) | index bytes / item | "
             "recall@10 re-ranked / codes alone | index opened | QPS batch 1 | QPS batch 256 | serve peak RSS (GB) | "
             "serve anonymous RSS (GB) | load before / after |",
             "|---:|---|---|---:|---:|---:|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        budget = "none (the machine's)" if r["budget_gb"] is None else f"{r['budget_gb']:g} GB"
        params = ",".join(f"{k}={v}" for k, v in r["params"].items()) or "exact"
        params += f", re-ranking {r['rerank']}x" if r["rerank"] else ""
        recall = f"{r['recall']:.3f} / {r['recall_raw']:.3f}" if r["rerank"] else f"{r['recall']:.3f} (floats)"
        lines.append(f"| {r['n']:,} | {budget} | {r['factory']} ({params}) | {r['build_s']:.0f} | "
                     f"{r['build_peak_rss'] / GB:.2f} | {r['faiss_bytes'] / r['n']:.0f} | {recall} | "
                     f"{'memory-mapped' if r['mmap'] else 'loaded'} | {r['qps_1']:,.0f} | {r['qps_256']:,.0f} | "
                     f"{r['serve_peak_rss'] / GB:.2f} | {r['serve_rss_anon'] / GB:.2f} | "
                     f"{r['load_before'][0]:.1f} / {r['load_after'][0]:.1f} |")
    lines += ["", "LMDB bytes per item (256-d float32 embeddings, no thumbnails): "
              f"{rows[0]['lmdb_bytes'] / rows[0]['n']:.0f}.", ""]
    for r in rows[::2]:
        budget = "none" if r["budget_gb"] is None else f"{r['budget_gb']:g} GB"
        plural = "s" * (r["candidates"] != 1)
        lines.append(f"- budget {budget}: {r['candidates']} candidate{plural} measured to the end; why: {r['reason']}"
                     + "".join(f"; skipped {s['factory']}: {s['reason']}" for s in r["skipped"]))
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        kind, db = sys.argv[2], Path(sys.argv[3])
        result = (child_build(db, None if sys.argv[4] == "None" else float(sys.argv[4])) if kind == "build"
                  else child_serve(db, Path(sys.argv[4]), sys.argv[5] == "True"))
        print(json.dumps(result, default=float))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="vectors in the gallery")
    parser.add_argument("--budgets", nargs="*", default=["none", "4"],
                        help="index memory budgets in GB (`index build --index-memory`); none: the machine's")
    parser.add_argument("--out", default="large_index", help="results file name under bench/results (.md, .json)")
    parser.add_argument("--work", type=Path, help="folder for the gallery (default: a temporary one, removed after)")
    args = parser.parse_args()
    budgets = [None if b == "none" else float(b) for b in args.budgets]
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        rows = bench(args.size, budgets, Path(tmp))
    text = table(rows)
    print(text)
    write_results(RESULTS / args.out, text, json.loads(json.dumps(rows, default=float)))


if __name__ == "__main__":
    main()
