"""Training with freed memory kept in the heap (`keep_heap`) against glibc's default, through the real CLI.

Each case trains a few short epochs with `metricsearch train`, once with `keep_heap: false` (the reference,
glibc's default: blocks over 32 MB are mapped afresh for each tensor and unmapped when freed) and once with
`keep_heap: true`, in alternating child processes, `--repeats` times each. The table gives the images per second
of the last epoch (the median over the repeats), the wall time of the whole command (a trunk cache is built before
the first epoch), its system CPU time, page faults and peak resident memory, and the ratios to the reference. The
weights must come out the same: the bench checks that both arms end with the same loss.

Run from the repository root: `python bench/train_heap.py` (configs/omniglot.yaml, its CNN on the shipped
background sets; configs/grocery.yaml, EfficientNet-Lite0 at 224 px on ../shared/data/grocery, on its cached frozen
trunk as shipped and fine-tuned whole).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_files import write_results

#: label -> (config, overrides): the shipped recipes on their data, cut to a few batches per epoch
CASES = {
    "omniglot small_cnn 28 px, bf16": ("omniglot", ["epochs=3", "batches_per_epoch=50"]),
    "grocery efficientnet_lite0 224 px, trunk cache": ("grocery", ["epochs=2", "batches_per_epoch=20"]),
    "grocery efficientnet_lite0 224 px, whole": ("grocery", ["epochs=2", "batches_per_epoch=8", "model.freeze=0",
                                                             "trunk_cache=0", "num_workers=0"]),
}
ARMS = {"default heap": False, "kept heap": True}  # the config's keep_heap


def run_once(config: str, overrides: list[str], keep: bool, out: Path) -> dict:
    """One `metricsearch train` in a child process: its last epoch's metrics and its resource use."""
    name = f"heap-{keep}"
    command = [shutil.which("metricsearch") or "metricsearch", "train", "--config", config, "--quiet",
               "--output-dir", str(out), "--overwrite", "--set", *overrides, f"name={name}",
               f"keep_heap={str(keep).lower()}"]
    log = out / f"{name}.stderr"
    with open(log, "w") as stderr:  # a file, not a pipe: the child never blocks on a full pipe while we wait
        t0 = time.perf_counter()
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(child.pid, 0)  # the child's own resource use, peak memory included
        wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{shlex.join(command)} failed:\n{log.read_text()}")
    last = json.loads((out / name / "metrics.jsonl").read_text().splitlines()[-1])
    return {"images_per_s": last["images_per_s"], "loss": last["loss"], "wall_s": wall, "sys_s": usage.ru_stime,
            "minor_faults": usage.ru_minflt, "peak_rss_mb": usage.ru_maxrss / 1024}


def line(row: dict) -> str:
    """One table row."""
    cells = [row["case"]]
    for arm in ARMS:
        r = row[arm]
        cells += [f"{r['images_per_s']:,.0f}", f"{r['wall_s']:.1f}", f"{r['sys_s']:.1f}",
                  f"{r['minor_faults'] / 1e6:.2f}", f"{r['peak_rss_mb']:,.0f}"]
    return "| " + " | ".join([*cells, f"{row['ratio']:.2f}x", f"{row['wall_ratio']:.2f}x"]) + " |"


HEADER = ("| case | default: img/s | wall s | sys s | faults (M) | peak RSS MB | kept: img/s | wall s | sys s "
          "| faults (M) | peak RSS MB | img/s ratio | wall speed-up |\n|---|" + "---:|" * 12)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="runs per arm and case, alternating arms")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES), metavar="CASE")
    parser.add_argument("--results", type=Path, help="write the table (.md) and the numbers (.json) here")
    args = parser.parse_args(argv)
    rows = []
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="train_heap_") as tmp:
        for case in args.cases:
            config, overrides = CASES[case]
            runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
            for _ in range(args.repeats):
                for arm, keep in ARMS.items():
                    runs[arm].append(run_once(config, overrides, keep, Path(tmp)))
            losses = {r["loss"] for rs in runs.values() for r in rs}
            if len(losses) != 1:
                raise SystemExit(f"{case}: the arms ended with different losses {sorted(losses)}")
            row = {"case": case, "runs": runs,
                   **{arm: {key: statistics.median(r[key] for r in rs) for key in rs[0] if key != "loss"}
                      for arm, rs in runs.items()}}
            row["ratio"] = row["kept heap"]["images_per_s"] / row["default heap"]["images_per_s"]
            row["wall_ratio"] = row["default heap"]["wall_s"] / row["kept heap"]["wall_s"]
            rows.append(row)
            print(line(row), flush=True)
    if args.results:
        import torch

        command = f"python bench/train_heap.py {shlex.join(argv if argv is not None else sys.argv[1:])}".strip()
        text = (f"# Training with freed memory kept in the heap\n\n`{command}`, {torch.get_num_threads()} threads, "
                f"CPU capability {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}. Medians "
                f"over {args.repeats} runs per arm; images/s of the last epoch; wall, system CPU time, minor page "
                f"faults and peak RSS of the whole command.\n\n{HEADER}\n" + "".join(line(r) + "\n" for r in rows))
        write_results(args.results, text, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
