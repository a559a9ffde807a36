"""Training speed with the augmentation on each image (affine: PIL, in the data loader) against on each batch
(batch_affine: tensors, on the training device), through the trainer's own setup, loader and step.

For each case the trainer builds its setup once per augmentation, the same parameters in both (the config's), and
every image's crop is made first (training caches it in the first epoch). Then the arms take their own epoch-0
batches in turn, batch by batch, so that a change of load touches both alike: the time to get a batch from the
loader (reading the cached crop, the per-image augmentation, normalising, collating) and the time of `train_step`
(with batch_affine, the warp of the whole batch in it). The first batches warm up and are not counted. The table
gives the median milliseconds per batch of each part, images per second, and the ratio to `affine`, the reference
measured in the same run.

Run from the repository root: `python bench/train_augment.py` (configs/omniglot.yaml on its shipped background
sets, 2 idle cores: about 2 minutes), `--results bench/results/train_augment` to keep the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from metricsearch.train.config import load_config, typed_config
from metricsearch.train.trainer import Setup, build_setup, epoch_batches, train_step
from results_files import write_results

#: label -> (config, overrides) of the cases
CASES = {"omniglot small_cnn 28 px": ("omniglot", [])}
#: the augmentations compared, with the same parameters (the config's)
ARMS = ("affine", "batch_affine")


def arms(config: str, overrides: list[str]) -> dict[str, Setup]:
    """The trainer's setup for `config`, once with its augment section as affine and once as batch_affine."""
    section = dict(load_config(config, overrides)["augment"])
    if section.get("name") not in ARMS:
        raise SystemExit(f"{config}: its augment is {section.get('name')!r}; this bench compares {' and '.join(ARMS)}")
    return {name: build_setup(typed_config(load_config(config, [*overrides,
                                                                f"augment={json.dumps({**section, 'name': name})}"])))
            for name in ARMS}


def time_arms(setups: dict[str, Setup], steps: int, warmup: int) -> dict[str, dict[str, float]]:
    """Median milliseconds per batch of loading and of the step, and images/s, arms alternating batch by batch."""
    loaders, times = {}, {name: {"load": [], "step": []} for name in setups}
    for name, setup in setups.items():
        for i in range(len(setup.dataset)):
            setup.dataset.pixels(i)
        setup.sampler.set_epoch(0)
        setup.model.train()
        loaders[name] = iter(epoch_batches(setup, seed=0))
    for _ in range(steps + warmup):
        for name, setup in setups.items():
            t0 = time.perf_counter()
            images, labels, indices = next(loaders[name])
            t1 = time.perf_counter()
            train_step(setup, images, labels, indices).item()
            times[name]["load"].append(t1 - t0)
            times[name]["step"].append(time.perf_counter() - t1)
    out = {}
    for name, parts in times.items():
        load, step = (1e3 * float(np.median(parts[p][warmup:])) for p in ("load", "step"))
        total = 1e3 * float(np.median(np.add(parts["load"], parts["step"])[warmup:]))
        out[name] = {"load_ms": load, "step_ms": step, "total_ms": total,
                     "images_per_s": 1e3 * len(images) / total}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="timed batches per arm")
    parser.add_argument("--warmup", type=int, default=5, help="untimed batches first")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="overrides for every case")
    parser.add_argument("--results", type=Path, help="write the table (.md) and the numbers (.json) here")
    args = parser.parse_args(argv)
    lines = ["| case | augmentation | load ms/batch | step ms/batch | total ms/batch | images/s | ratio to affine |",
             "|---|---|---:|---:|---:|---:|---:|"]
    rows = []
    for case, (config, overrides) in CASES.items():
        result = time_arms(arms(config, [*overrides, *args.set]), args.steps, args.warmup)
        for name, r in result.items():
            ratio = r["images_per_s"] / result["affine"]["images_per_s"]
            rows.append({"case": case, "augment": name, **r, "ratio": ratio})
            lines.append(f"| {case} | {name} | {r['load_ms']:.1f} | {r['step_ms']:.1f} | {r['total_ms']:.1f} | "
                         f"{r['images_per_s']:,.0f} | {ratio:.2f}x |")
    text = "\n".join(lines) + (f"\n\nMedians over {args.steps} batches per arm after {args.warmup} untimed; "
                               f"{torch.get_num_threads()} threads. Command: python bench/train_augment.py "
                               + " ".join(sys.argv[1:] if argv is None else argv))
    print(text)
    if args.results:
        write_results(args.results, text, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
