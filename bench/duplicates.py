"""Near-duplicate search speed and memory: `duplicate_groups` on synthetic unit vectors (128-d) with planted
near-copies (cosine about 0.97), at 100k and 1M vectors (IVF above 50k, exact below); each size runs in a
fresh process so its peak memory is its own.

    python bench/duplicates.py                        # 100k and 1M
    python bench/duplicates.py --sizes 100000

Writes a markdown table to stdout and bench/results/duplicates.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).with_name("results")
DIM = 128


def synthetic(n: int, planted: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n unit vectors whose last `planted` are noisy copies (cosine about 0.97) of the first `planted`;
    returns (vectors, the copy's original row for each planted row)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, DIM), dtype=np.float32)
    x[n - planted:] = x[:planted] + 0.25 * rng.standard_normal((planted, DIM), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x, np.arange(planted)


def run_one(n: int, threshold: float) -> dict:
    """Time `duplicate_groups` at n vectors; planted pairs found, groups, seconds, peak resident memory."""
    from metricsearch.index.duplicates import EXACT_MAX, duplicate_groups

    planted = n // 100
    x, originals = synthetic(n, planted)
    start = time.perf_counter()
    groups = duplicate_groups(x, threshold)
    seconds = time.perf_counter() - start
    group_of = np.full(n, -1)
    for g, (rows, _) in enumerate(groups):
        group_of[rows] = g
    copies = np.arange(n - planted, n)
    found = (group_of[copies] >= 0) & (group_of[copies] == group_of[originals])
    return {"n": n, "search": "exact" if n <= EXACT_MAX else "IVF", "seconds": round(seconds, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "vectors_mb": round(x.nbytes / 2**20), "planted_found": f"{int(found.sum())}/{planted}",
            "groups": len(groups), "largest": max((len(r) for r, _ in groups), default=0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--threshold", type=float, default=0.95)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child process's size
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.threshold)))
        return
    keys = ["n", "search", "seconds", "peak_rss_mb", "vectors_mb", "planted_found", "groups", "largest"]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    print("\n".join(lines), flush=True)
    RESULTS.mkdir(exist_ok=True)
    for n in args.sizes:  # each row printed and saved as it comes: a 1M run takes minutes on 2 cores
        row = json.loads(subprocess.run([sys.executable, __file__, "--one", str(n), "--threshold", str(args.threshold)],
                                        check=True, capture_output=True, text=True).stdout)
        lines.append("| " + " | ".join(f"{row[k]:,}" if isinstance(row[k], int) else str(row[k]) for k in keys) + " |")
        print(lines[-1], flush=True)
        (RESULTS / "duplicates.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
