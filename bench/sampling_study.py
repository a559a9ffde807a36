"""Does importance sampling make batch designs interchangeable? (weighted-contrastive paper, Table 1)

Trains the balanced contrastive loss on Omniglot (CPU) with each batch design, once with plain
per-batch averaging and once with importance sampling (IS), and reports R@1 on the held-out
alphabets. The paper (CUB200, ResNet-50, 2000 iterations) finds that without IS R@1 varies a lot
across designs and that with IS the spread collapses.

Run: `python bench/sampling_study.py [--steps 180] [--seeds 0] [--designs g2x32 g8x8 ...]`.
Prints one progress line per run, then a markdown table, and writes the table and the raw rows
to `bench/results/sampling_study.json`.

Setup (what is fixed across runs, and where it differs from the paper):

* Base recipe `configs/omniglot.yaml` (small CNN, 28x28, AdamW lr 2e-3, cosine schedule with one
  warm-up epoch, affine augmentation); only the loss, sampler, weighting, epochs,
  batches_per_epoch and eval settings are overridden. The learning rate is NOT changed for IS:
  with IS the mini-batch loss estimates the full-data mean pair loss, and for these designs its
  scale stays within the same order as the plain per-batch mean (the weights W are printed).
* Loss: `balanced_contrastive` with the paper's lam = 256 (section 6) and margin a = 1.0 (the
  paper gives no margin; METHODS.md's contrastive default), on L2-normalised embeddings.
* IS: `weighting: {name: importance, delta: 1.0}` (eqs. 24, 25; delta = 1, the exact weights).
* Equal budget: every design draws the same number of images per step (64 by default):
  (m, n)-group with m n = 64 and p-random with 32 pairs (64 images). The paper instead equalised
  the number of pairs (2016 per batch, i.e. 4032 images for p-random), so here p-random sees
  2016 / 32 = 63x fewer pairs per step than the group designs.
* Omniglot characters have 20 drawings each, so the (32, 2)-group design falls back to all 20
  images of each of its 2 classes (the group sampler's rule for classes with fewer than m
  images): 40 images per step, not 64. Its IS weights use the same rule (group.q_group).
* Eval: R@1 on the test alphabets once, at the end of training; NMI off.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from metricsearch.train.samplers import build_sampler
from metricsearch.train.weightings import build_weighting
from metricsearch.train.config import load_config
from metricsearch.data import load_split
from metricsearch.train.trainer import train

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "omniglot.yaml"
DEFAULT_DATA = "../shared/data/omniglot"  # relative to the repo root
DEFAULT_RESULTS = REPO / "bench" / "results" / "sampling_study.json"

#: design key -> (label, sampler section for `images` images per step)
DESIGN_ORDER = ("g2x32", "g8x8", "g32x2", "p0.1", "p0.5", "p0.9")


def sampler_section(design: str, images: int) -> dict[str, Any]:
    """The sampler config of a design key: `gMxN` ((m, n)-group, m images x n classes) or `pP` (p-random)."""
    if design.startswith("g"):
        m, n = (int(v) for v in design[1:].split("x"))
        if m * n != images:
            raise ValueError(f"design {design}: m n = {m * n} but --images-per-step is {images}")
        return {"name": "group", "images_per_class": m, "classes_per_batch": n}
    if design.startswith("p"):
        if images % 2:
            raise ValueError(f"--images-per-step must be even for p-random, got {images}")
        return {"name": "p_random", "p": float(design[1:]), "pairs_per_batch": images // 2}
    raise ValueError(f"unknown design {design!r}: use gMxN (e.g. g8x8) or pP (e.g. p0.5)")


def design_label(design: str) -> str:
    if design.startswith("g"):
        m, n = design[1:].split("x")
        return f"group ({m},{n})"
    return f"p-random p={design[1:]}"


def design_shape(sampler: Any) -> dict[str, Any]:
    """Images actually drawn per step and pairs per step of a built sampler (fixed for balanced classes)."""
    batch = np.asarray(next(iter(sampler)))
    images = len(batch)
    pairs = images // 2 if sampler.fixes_pairs else images * (images - 1) // 2
    return {"images_per_step": images, "pairs_per_step": pairs}


def importance_summary(sampler: Any, counts: dict[int, int]) -> dict[str, float]:
    """W = P_uniform / Q for a positive and a negative pair (all classes have equal size here)."""
    w = build_weighting("importance", {"sampler": sampler, "class_counts": counts}, delta=1.0)
    weights = w.weights.numpy()
    off = ~np.eye(len(weights), dtype=bool)
    return {
        "w_pos_mean": float(np.diag(weights).mean()), "w_pos_max": float(np.diag(weights).max()),
        "w_neg_mean": float(weights[off].mean()), "w_neg_max": float(weights[off].max()),
    }


def build_config(args: argparse.Namespace, data: Path, design: str, use_is: bool, seed: int,
                 out_dir: Path) -> dict[str, Any]:
    epochs = args.epochs
    overrides = [
        f"sampler={json.dumps(sampler_section(design, args.images_per_step))}",
        f"loss={json.dumps({'name': 'balanced_contrastive', 'lam': args.lam, 'margin': args.margin})}",
        f"weighting={json.dumps({'name': 'importance', 'delta': args.delta} if use_is else {'name': None})}",
        f"epochs={epochs}",
        f"batches_per_epoch={args.steps // epochs}",
        "eval.nmi=false",
        f"seed={seed}",
        "num_workers=0",
        "split=test",  # configs/omniglot.yaml is a final fit: measure on the held-out alphabets, once, at the end
        "val_classes=0",  # every training alphabet's class trains, as this study was run; best.pt is the last epoch
        "augment_classes=[]",  # and without its rotated classes and test-time views, as this study was run
        "model.tta_shifts=[]",
    ]
    config = load_config(args.config, overrides)
    config["dataset"] = f"omniglot:{data}"
    config["output_dir"] = str(out_dir)
    config["name"] = f"{design}-{'is' if use_is else 'plain'}-s{seed}"
    return config


def fmt(values: list[float]) -> str:
    """Mean (x100) over seeds, with the seeds' std when there are several."""
    mean = 100 * statistics.fmean(values)
    if len(values) > 1:
        return f"{mean:.1f} ± {100 * statistics.stdev(values):.1f}"
    return f"{mean:.1f}"


def spread_rows(means: dict[str, dict[bool, float]], designs: list[str]) -> list[tuple[str, list[str], dict]]:
    """(label, designs, {IS: (spread, std)}) for all designs and, where >= 2, each family."""
    groups = [("all designs", designs)]
    fam_g = [d for d in designs if d.startswith("g")]
    fam_p = [d for d in designs if d.startswith("p")]
    if fam_g and fam_p:
        groups += [("group designs", fam_g), ("p-random designs", fam_p)]
    out = []
    for label, ds in groups:
        if len(ds) < 2:
            continue
        stats = {}
        for use_is in (False, True):
            vals = [100 * means[d][use_is] for d in ds]
            stats[use_is] = {"spread": max(vals) - min(vals), "std": statistics.pstdev(vals)}
        out.append((label, ds, stats))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", default=DEFAULT_DATA, help="Omniglot folder (relative paths: to the repo root)")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="base recipe")
    p.add_argument("--steps", type=int, default=180, help="training steps (batches) per run")
    p.add_argument("--epochs", type=int, default=3,
                   help="epochs the steps are split into (the recipe warms up for one epoch)")
    p.add_argument("--images-per-step", type=int, default=64, help="images per batch for every design")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--designs", nargs="+", default=list(DESIGN_ORDER),
                   help="subset of gMxN ((m,n)-group: m images x n classes) and pP (p-random) designs")
    p.add_argument("--lam", type=float, default=256.0, help="balanced contrastive lambda (paper: 256)")
    p.add_argument("--margin", type=float, default=1.0, help="contrastive margin a")
    p.add_argument("--delta", type=float, default=1.0, help="IS weight exponent (paper: 1)")
    p.add_argument("--output-dir", type=Path, default=None, help="run folders (default: a temp dir, removed)")
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="JSON file to write")
    args = p.parse_args(argv)

    if args.steps < args.epochs:
        p.error(f"--steps ({args.steps}) must be >= --epochs ({args.epochs})")
    if args.steps % args.epochs:
        print(f"note: --steps {args.steps} is not a multiple of --epochs {args.epochs}; "
              f"using {args.steps // args.epochs * args.epochs}", flush=True)
    for d in args.designs:
        sampler_section(d, args.images_per_step)  # validate early
    data = Path(args.data).expanduser()
    data = (data if data.is_absolute() else REPO / data).resolve()
    if not data.is_dir():
        p.error(f"--data {data} does not exist")
    temp = args.output_dir is None
    out_dir = Path(tempfile.mkdtemp(prefix="sampling_study-")) if temp else args.output_dir

    split = load_split(f"omniglot:{data}")
    train_labels = np.asarray(split.train.labels)
    counts = split.train.class_counts()
    print(f"Omniglot: {len(split.train.class_names)} train classes / {len(train_labels)} images, "
          f"{len(split.test.class_names)} test classes / {len(split.test.labels)} images; "
          f"images per class {sorted(set(counts.values()))}", flush=True)

    shapes: dict[str, dict[str, Any]] = {}
    for d in args.designs:
        cfg = build_config(args, data, d, True, 0, out_dir)
        params = dict(cfg["sampler"])
        sampler = build_sampler(params.pop("name"), train_labels, seed=0, batches_per_epoch=1, **params)
        shapes[d] = {**design_shape(sampler), **importance_summary(sampler, counts)}
        note = ""
        if d.startswith("g") and shapes[d]["images_per_step"] != args.images_per_step:
            note = (f"  (classes have {max(counts.values())} images < m: the group sampler takes all of them, "
                    f"so {shapes[d]['images_per_step']} images per step)")
        print(f"  {design_label(d):16s} images/step {shapes[d]['images_per_step']:3d}  pairs/step "
              f"{shapes[d]['pairs_per_step']:4d}  IS weights W_pos {shapes[d]['w_pos_mean']:.4g}  "
              f"W_neg {shapes[d]['w_neg_mean']:.4g}{note}", flush=True)

    runs = [(s, d, use_is) for s in args.seeds for d in args.designs for use_is in (False, True)]
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    steps = args.steps // args.epochs * args.epochs
    print(f"{len(runs)} runs of {steps} steps ({args.epochs} epochs x {steps // args.epochs}), "
          f"balanced_contrastive lam={args.lam:g} margin={args.margin:g}; runs in {out_dir}", flush=True)
    try:
        for k, (seed, d, use_is) in enumerate(runs, 1):
            cfg = build_config(args, data, d, use_is, seed, out_dir)
            t0 = time.perf_counter()
            result = train(cfg, overwrite=True, progress=False)
            seconds = time.perf_counter() - t0
            m = result.test  # the held-out alphabets, scored once with the last epoch
            row = {
                "design": d, "label": design_label(d), "importance_sampling": use_is, "seed": seed,
                "steps": steps, **shapes[d],
                "recall_at_1": m["recall_at_k"][1], "recall_at_k": m["recall_at_k"],
                "map_at_r": m.get("map_at_r"), "last_epoch_loss": result.last_metrics.get("loss"),
                "seconds": seconds, "sampler": cfg["sampler"], "weighting": cfg["weighting"],
            }
            rows.append(row)
            elapsed = time.perf_counter() - start
            eta = elapsed / k * (len(runs) - k)
            print(f"[{k:2d}/{len(runs)}] {design_label(d):16s} IS={'Y' if use_is else 'N'} seed {seed}: "
                  f"R@1 {100 * row['recall_at_1']:.1f}  MAP@R {100 * (row['map_at_r'] or 0):.1f}  "
                  f"loss {row['last_epoch_loss']:.4f}  {seconds:.0f}s  (elapsed {elapsed / 60:.1f} min, "
                  f"eta {eta / 60:.1f} min)", flush=True)
    finally:
        if temp:
            shutil.rmtree(out_dir, ignore_errors=True)
    wall = time.perf_counter() - start

    by: dict[str, dict[bool, list[float]]] = {d: {False: [], True: []} for d in args.designs}
    for r in rows:
        by[r["design"]][r["importance_sampling"]].append(r["recall_at_1"])
    means = {d: {k: statistics.fmean(v) for k, v in by[d].items()} for d in args.designs}

    seeds_note = f" (mean ± std over seeds {args.seeds})" if len(args.seeds) > 1 else f" (seed {args.seeds[0]})"
    lines = [
        f"R@1 (%) on Omniglot test alphabets, balanced contrastive (lam={args.lam:g}, margin={args.margin:g}), "
        f"{steps} steps{seeds_note}",
        "",
        "| design | batch size | pairs / step | R@1 without IS | R@1 with IS |",
        "|---|---|---|---|---|",
    ]
    for d in args.designs:
        lines.append(f"| {design_label(d)} | {shapes[d]['images_per_step']} | {shapes[d]['pairs_per_step']} | "
                     f"{fmt(by[d][False])} | {fmt(by[d][True])} |")
    spreads = spread_rows(means, args.designs)
    for label, _, st in spreads:
        lines.append(f"| spread (max - min), {label} | | | {st[False]['spread']:.1f} | {st[True]['spread']:.1f} |")
        lines.append(f"| std, {label} | | | {st[False]['std']:.1f} | {st[True]['std']:.1f} |")
    table = "\n".join(lines)
    print()
    print(table)
    print(f"\nwall time {wall / 60:.1f} min for {len(runs)} runs")

    args.results.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "base_config": str(args.config), "data": str(data),
        "setup": {"loss": {"name": "balanced_contrastive", "lam": args.lam, "margin": args.margin},
                  "importance": {"name": "importance", "delta": args.delta},
                  "steps": steps, "epochs": args.epochs, "images_per_step": args.images_per_step,
                  "seeds": args.seeds, "eval": "R@1 once at the end, NMI off",
                  "train_classes": len(split.train.class_names), "train_images": int(len(train_labels)),
                  "test_classes": len(split.test.class_names), "test_images": int(len(split.test.labels))},
        "designs": {d: {"label": design_label(d), **shapes[d]} for d in args.designs},
        "table_markdown": table,
        "summary": {
            "mean_recall_at_1": {d: {"without_is": means[d][False], "with_is": means[d][True]} for d in args.designs},
            "spread": [{"over": label, "designs": ds,
                        "without_is": st[False], "with_is": st[True]} for label, ds, st in spreads],
            "std_note": "population std over designs of the per-design mean R@1, in percentage points",
        },
        "rows": rows,
        "wall_seconds": wall,
    }
    args.results.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
