"""An IVF index built in shards on Ray (index/sharded_build.py, `index build --engine ray`) against one process:
the index is trained once, then every vector is added (a) to one index here, with faiss on every core, and (b) in
K shards on K Ray tasks of one CPU each, their inverted lists merged here; on clustered unit vectors
(bench/gallery_speed.py's).

    python bench/ray_merge.py                            # 1M 128-d vectors, 2 shards (about 10 minutes, 2 idle cores)
    python bench/ray_merge.py --n 200000 --shards 2 4    # 200k

Per index (default: auto's first IVF candidate for N, IVF-SQ8 and the IVF-PQ that `--index ivfpq` builds): the seconds
of each step, the sharded add's wall time over the one-process add's (the ratio), and the merge's share of the
one-process add (what a cluster cannot take off the one machine). The two indexes are checked to hold the same lists.
Writes bench/results/ray_merge.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import faiss
import numpy as np

from metricsearch.index.autoindex import NITER
from metricsearch.index.faiss_index import choose_index, ivf_lists, train_index
from metricsearch.index.ray_engine import ray_session
from metricsearch.index.sharded_build import add_in_shards, sharded_choice

sys.path.insert(0, str(Path(__file__).parent))
from gallery_speed import clustered  # noqa: E402  (the vectors of bench/gallery_speed.py)

RESULTS = Path(__file__).with_name("results")


def same_lists(a: faiss.Index, b: faiss.Index) -> bool:
    """Whether two IVF indexes hold the same ids and codes in the same order in every list."""
    la, lb = faiss.extract_index_ivf(a).invlists, faiss.extract_index_ivf(b).invlists
    for i in range(la.nlist):
        n = la.list_size(i)
        if n != lb.list_size(i):
            return False
        if n and not (np.array_equal(faiss.rev_swig_ptr(la.get_ids(i), n), faiss.rev_swig_ptr(lb.get_ids(i), n))
                      and np.array_equal(faiss.rev_swig_ptr(la.get_codes(i), n * la.code_size),
                                         faiss.rev_swig_ptr(lb.get_codes(i), n * lb.code_size))):
            return False
    return True


def bench_factory(ray, vectors: np.ndarray, ids: np.ndarray, factory: str, shard_counts: list[int]) -> list[dict]:
    """Train `factory` once; add every vector in one process, then in each count of shards on Ray."""
    start = time.perf_counter()
    trained, _, _ = train_index(vectors, factory, niter=NITER)
    train_s = time.perf_counter() - start
    blob = faiss.serialize_index(trained)
    one = faiss.deserialize_index(blob)
    start = time.perf_counter()
    one.add_with_ids(vectors, ids)
    one_s = time.perf_counter() - start
    add_in_shards(ray, faiss.deserialize_index(blob), vectors[:1000], ids[:1000], max(shard_counts))  # warm-up
    rows = []
    for shards in shard_counts:
        sharded = faiss.deserialize_index(blob)
        seconds = add_in_shards(ray, sharded, vectors, ids, shards)
        rows.append({"n": len(vectors), "dim": vectors.shape[1], "factory": factory, "shards": shards,
                     "train_s": train_s, "one_process_add_s": one_s, **seconds,
                     "same_lists": sharded.ntotal == one.ntotal == len(vectors) and same_lists(sharded, one)})
        print(json.dumps(rows[-1]), flush=True)
        del sharded
    return rows


def table(rows: list[dict], load: float) -> str:
    lines = [f"{os.cpu_count()} CPU cores (load average {load:.1f} at the start), a local Ray cluster of them.", "",
             f"| vectors | index | shards | train once (s) | one process: add all, {os.cpu_count()} threads (s) | "
             "Ray: K shards added + merged, wall (s) | slowest shard's add, 1 thread (s) | merges here (s) | "
             "rest: transfers, (de)serialising, shards queued for a CPU (s) | Ray wall / one process | "
             "merges / one-process add | same lists |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        rest = r["add_s"] - r["shard_add_s"] - r["merge_s"]
        lines.append(f"| {r['n']:,} x {r['dim']} | {r['factory']} | {r['shards']} | {r['train_s']:.1f} | "
                     f"{r['one_process_add_s']:.2f} | {r['add_s']:.2f} | {r['shard_add_s']:.2f} | {r['merge_s']:.2f} | "
                     f"{rest:.2f} | **{r['add_s'] / r['one_process_add_s']:.2f}x** | "
                     f"{r['merge_s'] / r['one_process_add_s']:.1%} | {'yes' if r['same_lists'] else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="vectors")
    parser.add_argument("--dim", type=int, default=128, help="dimensions")
    parser.add_argument("--shards", type=int, nargs="+", default=[2], help="shard counts (Ray tasks)")
    parser.add_argument("--index", nargs="+", help="faiss factory strings (default: auto's first IVF candidate for N, "
                        "IVF-SQ8 at the rule's lists and the IVF-PQ of --index ivfpq)")
    parser.add_argument("--out", default="ray_merge", help="results file name under bench/results, no suffix")
    args = parser.parse_args()
    load = os.getloadavg()[0]  # the machine may be shared: said beside the numbers
    factories = args.index or [sharded_choice(args.n, args.dim, "auto", 1 << 50)[0].factory,
                               f"IVF{ivf_lists(args.n)},SQ8", choose_index(args.n, args.dim, "ivfpq", 1 << 50).factory]
    vectors = clustered(args.n, args.n // 50, args.dim)
    ids = np.arange(args.n, dtype=np.int64)
    rows = []
    with ray_session() as ray:  # a local cluster of this machine's CPUs, started before the clock
        for factory in factories:
            rows += bench_factory(ray, vectors, ids, factory, args.shards)
    text = table(rows, load)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.md").write_text(text + "\n")
    (RESULTS / f"{args.out}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
