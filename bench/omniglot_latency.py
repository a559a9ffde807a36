"""How long an exported Omniglot model takes to answer a 20-way one-shot episode on this machine.

One episode: 21 decoded drawings (20 examples and one query, drawn at random from the test alphabets)
embedded in one onnxruntime call (preprocessing and the model's test-time views included), then the
query's nearest example. Models are timed in turn on the same episodes (interleaved, so a change of
load touches them alike); the table gives the median and 90th percentile per episode and the ratio
of medians to the first model, the reference measured in the same run. The issue 19 budget is 50 ms.
"One query" times a query alone, as a search service answers it once the 20 examples are indexed.

Run: `python bench/omniglot_latency.py before=old.onnx after=omniglot.onnx` (ONNX files made by
`metricsearch export`); the images come from the background sets in ../shared/data/omniglot. `--results
bench/results/NAME` also writes the table to NAME.md and its numbers to NAME.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from metricsearch.data import load_split
from metricsearch.models import OnnxEmbedder
from results_files import write_results

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "omniglot"


def time_episodes(models: dict[str, OnnxEmbedder], images: list, episodes: int, ways: int = 20,
                  seed: int = 0) -> dict[str, np.ndarray]:
    """Seconds per episode of each model (ways examples + 1 query embedded in one call, then nearest) and for
    its query alone: an array of (episode, query) rows per model."""
    rng = np.random.default_rng(seed)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(episodes + 5):  # the first 5 episodes warm the sessions up and are not counted
        batch = [images[i] for i in rng.choice(len(images), ways + 1, replace=False)]
        for name, model in models.items():
            t0 = time.perf_counter()
            x = model.embed_images(batch)
            int(np.argmax(x[:ways] @ x[ways]))
            t1 = time.perf_counter()
            model.embed_images(batch[ways:])
            times[name].append((t1 - t0, time.perf_counter() - t1))
    return {name: np.array(t[5:]) for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", metavar="LABEL=MODEL.onnx",
                        help="models to time; the first is the reference")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of the Omniglot background sets")
    parser.add_argument("--episodes", type=int, default=150, help="timed episodes per model")
    parser.add_argument("--results", type=Path, help="also write the table to RESULTS.md, its numbers to RESULTS.json")
    args = parser.parse_args(argv)
    pairs = [m.partition("=") for m in args.models]
    if any(not sep for _, sep, _ in pairs):
        parser.error("give each model as LABEL=PATH, e.g. shipped=omniglot.onnx")
    models = {label: OnnxEmbedder(path, device="cpu") for label, _, path in pairs}
    test = load_split(f"omniglot:{args.data}", split="test").test
    images = [test.load(i) for i in range(min(len(test), 2000))]
    times = time_episodes(models, images, args.episodes)
    ref = float(np.median(next(iter(times.values()))[:, 0]))
    lines = [f"20-way episode (21 images in one call + nearest), {args.episodes} episodes, {os.cpu_count()} cores, "
             f"load {os.getloadavg()[0]:.1f}", "",
             "| model | passes an image | episode: median ms | p90 ms | ratio to first | one query: median ms |",
             "|---|---:|---:|---:|---:|---:|"]
    rows = {}
    for label, t in times.items():
        config = json.loads(models[label].metadata["model_config"])
        views = ((len(config.get("tta_shifts") or [[0, 0]]) + len(config.get("tta_rotations") or []))
                 * (1 + len(config.get("tta_symmetries") or [])))  # network passes per image
        rows[label] = {"model": str(models[label].path), "passes": views,
                       "episode_ms": (1000 * t[:, 0]).round(3).tolist(), "query_ms": (1000 * t[:, 1]).round(3).tolist()}
        lines.append(f"| {label} | {views} | {1000 * np.median(t[:, 0]):.1f} | {1000 * np.percentile(t[:, 0], 90):.1f} "
                     f"| {np.median(t[:, 0]) / ref:.2f} | {1000 * np.median(t[:, 1]):.1f} |")
    text = "\n".join(lines)
    print(text)
    if args.results:
        write_results(args.results, text, {"episodes": args.episodes, "cores": os.cpu_count(), "models": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
