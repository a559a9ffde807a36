"""Grocery Store photos on unseen classes: raw pixels, off-the-shelf ImageNet features, and fine-tuning with each
loss family of the papers, cross-validated over the two class halves; plus the trainer's speed against a bare loop.

Each fold trains on one half of the 41 fine classes (all their photos) and tests on the other half
(data/grocery.py): photo -> photo (the test-list photos query the train+val photos of the unseen classes: Recall@1,
MAP@R) and photo -> catalogue (the same photos query the unseen classes' iconic catalogue images: accuracy@1;
"expanded": the same with the catalogue expanded by the unseen classes' train+val photos used without their labels,
`evaluate --expand-with`). The queries of both folds are pooled; each figure comes with a 95% bootstrap interval
over the queries (2,000 resamples, seeded), and "vs off-the-shelf" is the paired difference in photo -> photo
Recall@1 to the off-the-shelf features at the training resolution, on the very same queries. Every fine-tuned row
starts from configs/grocery.yaml (the shipped recipe) and changes the loss family only; it trains on every class of
the other half, nothing validates (`val_classes=0`), and its last epoch is scored, as the recipe's final fit keeps
its last: the held-out half never chooses anything.

Families: `ms` (multi-similarity, the recipe's), `margin` (margin loss with a learned per-class beta +
distance-weighted sampling), `ice`, `contrastive` (balanced contrastive + importance sampling),
`dro` (DRO-TopK-PN over the contrastive pair loss); beyond the five papers, the proxy families `proxy_anchor` and
`normsoftmax` (one learned vector per class, the recipe's sampler kept so that only the loss changes).

Compact embeddings: `--dims 512 256 128` also scores the off-the-shelf features (at the recipe's resolution) and
every fine-tuned model projected by a PCA to each dimension, fit on the fold's training photos (as `export --dim`
fits it on the run's training images), re-normalised; "vs own full dimension" is the paired Recall@1 difference.

Speed: `--speed-batches N` times the trainer (config's batch, workers, augmentation, its own epoch
loop) against a bare PyTorch loop with the same model, batch, loss and optimizer over batches already
decoded in memory (the compute ceiling), one after the other in this process. With the recipe's
`trunk_cache` both loops train on the cached trunk outputs, and the cache's cost is the setup's.

Honest choice (issue 88): `--families ms proxy_anchor --choose-on-val 0.25` trains each family without a quarter
of its fold's training classes (best.pt chosen on them) and scores every family under every expansion rule of
EXPANSIONS on them (photo -> catalogue); a row "chosen on validation classes" gives, per fold, the test half's scores
of the family and rule they chose, that family trained again on every training class and scored with its last
epoch, as a final fit (its expanded column is the chosen rule's). The same run trains today's recipe (`ms` on
every training class, its last epoch, as `train --config grocery` does) as the row "the recipe", and every row gets
the paired differences to it: photo -> photo Recall@1, and photo -> catalogue (the row's expanded against the
recipe's plain catalogue, the figure issue 88 was filed on).

`--keep DIR --reuse` scores the runs already in DIR instead of training them again (e.g. after a new column).

Run: `nice -n 19 python bench/photos.py` (every row), or a quick pass:
`python bench/photos.py --epochs 1 --size 128 --families ms --folds half2`; the folds can run side by
side (`--folds half1 --results R1` and `--folds half2 --results R2`), then `--combine R1.json R2.json`; runs of
other seeds (`--set seed=S`) combine the same way, each query's scores averaged over the runs.
Prints one line per training (wall and CPU seconds), then a markdown table; writes it with the raw numbers to
bench/results/photos.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from metricsearch.data import ImageSet, load_query_gallery, load_split
from metricsearch.evaluation.distances import normalized, sq_distances
from metricsearch.evaluation.expansion import expand_gallery
from metricsearch.evaluation.metrics import average_precision_at_r, nearest
from metricsearch.models import PixelEmbedder
from metricsearch.models.torch_embedder import Embedder, build_embedder, load_embedder
from metricsearch.train.config import load_config, typed_config
from metricsearch.train.dataset import ImageDataset
from metricsearch.train.optim import build_optimizer
from metricsearch.train.projection import pca
from metricsearch.train.trainer import build_components, build_setup, train, train_epoch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "grocery"
RECIPE = REPO / "configs" / "grocery.yaml"
RESULTS = REPO / "bench" / "results" / "photos"
HALVES = ("half1", "half2")
METRICS = ("recall_at_1", "map_at_r", "catalogue_at_1", "catalogue_expanded_at_1")
BACKBONE = "efficientnet_lite0"
RECIPE_ROW = "the recipe"  # with --choose-on-val: today's recipe, every training class, its last epoch
CHOSEN_ROW = "chosen on validation classes"

#: family -> (overrides of configs/grocery.yaml, what it is)
FAMILIES: dict[str, tuple[list[str], str]] = {
    "ms": (["loss={name: ms, alpha: 2.0, beta: 50.0, base: 0.5, epsilon: 0.1}", "miner={name: null}"],
           "multi-similarity loss with MS mining (the recipe's)"),
    "margin": (["loss={name: margin, beta_mode: class}", "miner={name: distance_weighted, produces: pairs}"],
               "margin loss, learned class betas, distance-weighted sampling"),
    "ice": (["loss={name: ice, scale: 64}", "miner={name: null}"], "ICE, s = 64"),
    "contrastive": (["loss={name: balanced_contrastive, lam: 256, margin: 1.0}",
                     "weighting={name: importance, delta: 1.0}", "miner={name: null}"],
                    "balanced contrastive + importance sampling"),
    "dro": (["loss={name: dro_topk_pn, k: 100}", "miner={name: null}"],
            "DRO-TopK-PN weighting of the contrastive pair loss, K = 100"),
    "proxy_anchor": (["loss={name: proxy_anchor, alpha: 32.0, margin: 0.1}", "miner={name: null}"],
                     "Proxy-Anchor (beyond the five papers), alpha 32, margin 0.1, proxies at 100x the learning rate"),
    "normsoftmax": (["loss={name: normsoftmax}", "miner={name: null}"],
                    "normalised softmax (beyond the five papers), the paper's temperature, proxies at 100x"),
}


def nearest_photos(catalogue: np.ndarray, pool: np.ndarray, k: int = 5) -> np.ndarray:
    """Database-side augmentation: each entry plus the mean of its k nearest pool photos, re-normalised."""
    near = nearest(sq_distances(catalogue, pool), k)
    return normalized(catalogue + pool[near].mean(1))


#: expansion rule -> the catalogue entries it makes from the catalogue and the unlabelled pool (LOG.md's variants);
#: the first is the product's (`evaluate --expand-with`), and --choose-on-val lets validation classes choose
EXPANSIONS = {
    "anchored k-means": expand_gallery,
    "one round": lambda catalogue, pool: expand_gallery(catalogue, pool, rounds=1),
    "nearest 5": nearest_photos,
    "none": lambda catalogue, pool: catalogue,
}
SHIPPED = next(iter(EXPANSIONS))


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children (DataLoader workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def fold_sets(data: Path, half: str) -> dict[str, ImageSet]:
    """The held-out half's query photos, their photo gallery and their catalogue images, labels by class name."""
    spec = f"grocery:{data}"
    query, gallery = load_query_gallery(f"{spec}#test,{half}", f"{spec}#train+val,{half}")
    query_c, catalogue = load_query_gallery(f"{spec}#test,{half}", f"{spec}#catalogue,{half}")
    fit = load_split(spec + f"#{half}").train  # the photos the fold trains on: the projections are fit on them
    return {"query": query, "gallery": gallery, "catalogue": catalogue, "query_c": query_c, "fit": fit}


def embedded(model: Any, sets: dict[str, ImageSet]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The query photos', photo gallery's and catalogue's embeddings."""
    return tuple(model.embed_set(sets[k], batch_size=64) for k in ("query", "gallery", "catalogue"))


def per_query(model: Any, sets: dict[str, ImageSet], dims: list[int] = ()) -> dict[int | None, dict[str, np.ndarray]]:
    """Per query photo: photo -> photo hit@1 and AP@R, photo -> catalogue hit@1; under None for the model's own
    embedding, under each of `dims` for it projected by a PCA fit on the fold's training photos (`export --dim`)."""
    q, g, c = embedded(model, sets)
    out = {None: scores(q, g, c, sets)}
    if dims:
        fit = model.embed_set(sets["fit"], batch_size=64)
        for dim in dims:
            mean, matrix = pca(fit, dim)
            out[dim] = scores(*(normalized((x - mean) @ matrix) for x in (q, g, c)), sets)
    return out


def per_rule(model: Any, sets: dict[str, ImageSet]) -> dict[str, dict[str, np.ndarray]]:
    """`scores` under each expansion rule of EXPANSIONS (the sets embedded once)."""
    q, g, c = embedded(model, sets)
    return {name: scores(q, g, c, sets, rule) for name, rule in EXPANSIONS.items()}


def scores(q: np.ndarray, g: np.ndarray, c: np.ndarray, sets: dict[str, ImageSet],
           expand: Any = expand_gallery) -> dict[str, np.ndarray]:
    """Per query: photo -> photo hit@1 and AP@R, photo -> catalogue hit@1 (also with the catalogue expanded by the
    photo gallery, its labels unused, by the rule `expand`), from the three sets' embeddings."""
    ql, gl = sets["query"].labels, sets["gallery"].labels
    r = (gl[None, :] == ql[:, None]).sum(1)
    relevant = gl[nearest(sq_distances(q, g), int(r.max()))] == ql[:, None]
    def catalogue_hits(entries: np.ndarray) -> np.ndarray:
        return (sets["catalogue"].labels[sq_distances(q, entries).argmin(1)] == sets["query_c"].labels).astype(float)

    return {"recall_at_1": relevant[:, 0].astype(float), "map_at_r": average_precision_at_r(relevant, r),
            "catalogue_at_1": catalogue_hits(c), "catalogue_expanded_at_1": catalogue_hits(expand(c, g))}


def bootstrap(values: np.ndarray, resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its 95% percentile bootstrap interval over the entries."""
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), (resamples, len(values)))].mean(1)
    return float(values.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def off_the_shelf(size: int) -> Embedder:
    """The backbone's pooled, L2-normalised ImageNet features at `size` pixels (no head, no training)."""
    return Embedder(BACKBONE, dim=None, normalize=True, pretrained="imagenet", preprocessing={"size": size})


def recipe(family: str, half: str, data: Path, out: Path, extra: list[str], val: float = 0.0) -> dict[str, Any]:
    """configs/grocery.yaml with a family's loss, trained on every class of the other half (`val` 0: none
    validates, no epoch is evaluated, best.pt is the last) or on all but that fraction of them (validation classes:
    they choose best.pt), `half` held out (scored by this script)."""
    fixed = [f"dataset=grocery:{data}#{half}", "split=test", f"val_classes={val}", f"output_dir={out}",
             f"name={family}-{half}" + (f"-val{val:g}" if val else "")]
    return load_config(RECIPE, [*FAMILIES[family][0], *extra, *fixed])


def validation_sets(data: Path, half: str, fraction: float, seed: int) -> dict[str, ImageSet]:
    """The validation classes a run holding out `half` carves from its training half (`val_classes` = fraction,
    drawn with `seed` as the trainer draws them): their query photos, photo gallery and catalogue images."""
    names = load_split(f"grocery:{data}#{half}", split="test", val_classes=fraction, seed=seed).val.class_names
    other = next(h for h in HALVES if h != half)
    return {k: v.subset(np.flatnonzero(np.isin(np.asarray(v.class_names)[v.labels], names)))
            for k, v in fold_sets(data, other).items() if k != "fit"}


def chosen_on_validation(val_scores: dict[str, dict[str, dict[str, np.ndarray]]]) -> tuple[str, str, str]:
    """The (family, expansion rule) whose photo -> catalogue accuracy@1 on the validation classes is highest (the
    first listed on a tie: families in their order, then rules in EXPANSIONS' order), and a line of every figure."""
    means = {(f, r): float(by[r]["catalogue_expanded_at_1"].mean()) for f, by in val_scores.items() for r in by}
    family, rule = max(means, key=means.get)
    return family, rule, "; ".join(
        f"{f}: " + ", ".join(f"{r} {means[f, r]:.3f}" for r in by) + f" (R@1 {by[SHIPPED]['recall_at_1'].mean():.3f})"
        for f, by in val_scores.items())


def trained(family: str, half: str, data: Path, out: Path, extra: list[str], val: float,
            reuse: bool) -> tuple[Any, dict[str, Any]]:
    """A family's model trained with `half` held out (best.pt with validation classes, else last.pt; with `reuse`,
    the run already in `out`), and its training time."""
    config = recipe(family, half, data, out, extra, val)
    t0, c0, load = time.perf_counter(), cpu_seconds(), os.getloadavg()[0]
    checkpoint = "best.pt" if val else "last.pt"
    kept = out / config["name"] / checkpoint
    reused = reuse and kept.is_file()
    if not reused:
        kept = train(config, progress=False).run_dir / checkpoint
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    print(f"{family} {half}{f' (validation classes {val:g})' if val else ''}: {wall:.0f} s wall, {cpu:.0f} s CPU "
          f"(load {load:.1f})", file=sys.stderr, flush=True)
    return load_embedder(kept), {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load": round(load, 1),
                                 "epochs": config["epochs"], "reused": reused, "seed": config["seed"]}


def run(families: list[str], folds: list[str], data: Path, extra: list[str], keep: Path | None,
        partial: Path | None = None, dims: list[int] = (), reuse: bool = False, val: float = 0.0) -> list[dict]:
    """Score every row on every fold (fold by fold); after each training, the table so far goes to `partial`;
    with `reuse`, a family's run already in `keep` is scored, not trained again. With `val` > 0 the families train
    without that fraction of their classes, best.pt chosen on them, today's recipe trains on every class (the row
    RECIPE_ROW), and a last row scores, per fold, the family and expansion rule those validation classes choose
    (`chosen_on_validation`), the family trained again on every class (its last epoch, as a final fit): the test
    half never chooses."""
    config = load_config(RECIPE, extra)
    size, seed = int(config["model"]["preprocessing"].get("size", 224)), config["seed"]  # every family's seed
    rows: dict[str, dict[str, Any]] = {}

    def add(name: str, what: str, fold: str, scores: dict[str, np.ndarray], **info: Any) -> None:
        row = rows.setdefault(name, {"row": name, "what": what, "scores": {}, "train": {}})
        row["what"] = what  # the chosen row's grows fold by fold
        row["scores"][fold] = scores
        row["train"].update(info)
        if partial is not None and info:  # after each training
            partial.write_text(table(summarise(list(rows.values()), size), size, None) + "\n")

    with tempfile.TemporaryDirectory(prefix="photos_bench_") as tmp:
        out = keep or Path(tmp)
        for half in folds:
            sets, val_scores = fold_sets(data, half), {}
            add("pixels", "raw 32x32 RGB pixels, no training", half, per_query(PixelEmbedder(32, 3), sets)[None])
            for s in sorted({size, 224}):
                for dim, found in per_query(off_the_shelf(s), sets, dims if s == size else []).items():
                    add(f"off-the-shelf {s}px" + (f" {dim}-d" if dim else ""), f"{BACKBONE} ImageNet pooled features "
                        f"at {s} px" + (f", PCA to {dim}-d" if dim else ""), half, found)
            final: dict[str, tuple[tuple, dict[str, Any]]] = {}  # family -> (its test embeddings, its training)
            if val:
                vsets = validation_sets(data, half, val, seed)
                model, timing = trained("ms", half, data, out, extra, 0.0, reuse)
                final["ms"] = embedded(model, sets), timing
                add(RECIPE_ROW, "today's recipe: configs/grocery.yaml (ms) on every training class, its last epoch",
                    half, scores(*final["ms"][0], sets), **{half: timing})
            for family in families:
                model, timing = trained(family, half, data, out, extra, val, reuse)
                if val:
                    val_scores[family] = per_rule(model, vsets)
                found = per_query(model, sets, dims)
                print(f"{family} {half}: " + ", ".join(f"{k} {v.mean():.3f}" for k, v in found[None].items()),
                      file=sys.stderr, flush=True)
                for dim, by_query in found.items():
                    what = FAMILIES[family][1] + (f", PCA to {dim}-d" if dim else "")
                    add(family + (f" {dim}-d" if dim else ""), what, half, by_query, **{half: timing})
            if val_scores:
                family, rule, figures = chosen_on_validation(val_scores)
                if family not in final:
                    model, timing = trained(family, half, data, out, extra, 0.0, reuse)
                    final[family] = embedded(model, sets), timing
                earlier = rows.get(CHOSEN_ROW, {}).get("what", "")
                add(CHOSEN_ROW, (earlier + "; " if earlier else "") + f"{half} held out: {family} with the expansion "
                    f"'{rule}', chosen on {val:g} of the training classes (expanded catalogue acc@1 there: {figures}), "
                    "then trained on every training class, its last epoch", half,
                    scores(*final[family][0], sets, EXPANSIONS[rule]), **{half: final[family][1]})
    return list(rows.values())


def summarise(rows: list[dict[str, Any]], size: int) -> list[dict[str, Any]]:
    """Pooled per-query scores with bootstrap intervals, the paired Recall@1 difference to off-the-shelf, and to
    today's recipe where the run trained it (RECIPE_ROW)."""
    reference = next(r for r in rows if r["row"] == f"off-the-shelf {size}px")
    out = []
    for r in rows:
        folds = list(r["scores"])
        p = {m: np.concatenate([r["scores"][f][m] for f in folds]) for m in METRICS
             if all(m in r["scores"][f] for f in folds)}  # results of older runs lack the expanded column
        ref = np.concatenate([reference["scores"][f]["recall_at_1"] for f in folds])
        item = {"row": r["row"], "what": r["what"], "folds": folds, "train": r["train"],
                **{m: bootstrap(v) for m, v in p.items()},
                "by_fold": {f: {m: float(v.mean()) for m, v in r["scores"][f].items()} for f in folds},
                "recall_at_1_vs_off_the_shelf": bootstrap(p["recall_at_1"] - ref)}
        base = next((b for b in rows if b["row"] == RECIPE_ROW and all(f in b["scores"] for f in folds)), None)
        if base is not None and r is not base:  # paired to the recipe: Recall@1; expanded catalogue to its plain
            item["vs_recipe"] = {m: bootstrap(p[m] - np.concatenate([base["scores"][f][b] for f in folds]))
                                 for m, b in (("recall_at_1", "recall_at_1"),
                                              ("catalogue_expanded_at_1", "catalogue_at_1")) if m in p}
        full = next((f for f in rows if r["row"].startswith(f["row"] + " ") and r["row"].endswith("-d")), None)
        if full is not None:  # a projected row: the paired difference to its own model's full embedding
            item["recall_at_1_vs_full"] = bootstrap(p["recall_at_1"] - np.concatenate(
                [full["scores"][f]["recall_at_1"] for f in folds]))
        out.append(item)
    return out


def speed(batches: int, extra: list[str], data: Path) -> dict[str, float]:
    """Images/s of the trainer's epoch loop and of a bare loop (same model, batch, loss, optimizer, decoded batches)."""
    with tempfile.TemporaryDirectory(prefix="photos_speed_") as tmp:
        config = typed_config(load_config(RECIPE, [*extra, f"dataset=grocery:{data}", f"batches_per_epoch={batches}",
                                                  f"output_dir={tmp}", "name=speed"]))
        c0 = cpu_seconds()
        setup = build_setup(config)  # with trunk_cache: the frozen trunk runs over every training photo here
        setup_cpu, c0 = cpu_seconds() - c0, cpu_seconds()
        trainer = train_epoch(setup, 0, Path(tmp))["images_per_s"]
        trainer_cpu = cpu_seconds() - c0
        torch.manual_seed(0)
        model = build_embedder(config.model.model_dump(mode="json"), pretrained=config.model.pretrained)
        loss = build_components(config, setup.split.train, embedding_dim=model.part_dim)[0]
        optimizer = build_optimizer(config.optimizer, model, loss)
        plain = ImageDataset(setup.split.train, model.preprocessing)
        cache, views = setup.trunk_cache, torch.Generator().manual_seed(0)
        decoded = [(torch.stack([plain[i][0] for i in b]) if cache is None else cache.batch(torch.as_tensor(b), views),
                    torch.as_tensor(setup.split.train.labels[b])) for b in list(iter(setup.sampler))[:batches]]
        forward = model if cache is None else model.embed_from_trunk  # the trainer's steps run the same
        model.train()
        t0, c0 = time.perf_counter(), cpu_seconds()
        for images, labels in decoded:
            value = loss(forward(images), labels, mined=setup.sampler.pairs(labels))
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            optimizer.step()
        bare = sum(len(b[0]) for b in decoded) / (time.perf_counter() - t0)
        return {"trainer_images_per_s": trainer, "bare_images_per_s": bare, "ratio": trainer / bare,
                "trainer_cpu_s": trainer_cpu, "bare_cpu_s": cpu_seconds() - c0, "batches": batches,
                "setup_cpu_s": setup_cpu, "trunk_cache": config.trunk_cache,
                "batch": len(decoded[0][0]), "num_workers": config.num_workers}


def combine(paths: list[Path]) -> tuple[list[dict[str, Any]], dict[str, float] | None]:
    """The rows of earlier runs' RESULTS.json files (e.g. one per fold, run side by side), folds merged; their speed.
    A row scored on a fold by several runs (e.g. one per `--set seed=S`) gets each query's mean over them."""
    rows: dict[str, dict[str, Any]] = {}
    runs: dict[tuple[str, str], list[dict[str, np.ndarray]]] = {}
    fast = None
    for path in paths:
        saved = json.loads(path.read_text())
        fast = fast or saved["speed"]
        for name, r in saved["raw"].items():
            row = rows.setdefault(name, {"row": name, "what": r["what"], "scores": {}, "train": {}})
            row["train"].update(r["train"])
            for f, by in r["scores"].items():
                runs.setdefault((name, f), []).append({m: np.asarray(v) for m, v in by.items()})
    notes: dict[str, list[str]] = {}
    for (name, f), scored in runs.items():
        common = set.intersection(*(set(s) for s in scored))  # older runs lack the expanded column
        rows[name]["scores"][f] = {m: np.mean([s[m] for s in scored], 0) for m in METRICS if m in common}
        if len(scored) > 1 and "catalogue_expanded_at_1" in common:
            notes.setdefault(name, []).append(f"{f} " + ", ".join(
                f"{s['catalogue_expanded_at_1'].mean():.3f}" for s in scored))
    for name, lines in notes.items():
        rows[name]["what"] += f" [each query's mean over its runs; expanded catalogue by run: {'; '.join(lines)}]"
    return list(rows.values()), fast


def table(summary: list[dict[str, Any]], size: int, fast: dict[str, float] | None) -> str:
    def ci(v) -> str:
        return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"

    def signed(v) -> str:
        return f"{v[0]:+.3f} [{v[1]:+.3f}, {v[2]:+.3f}]"

    folds = "+".join(summary[0]["folds"])
    paired = any("vs_recipe" in s for s in summary)
    lines = [f"Grocery Store, unseen classes, held-out halves {folds} pooled (a row's queries over the folds it ran); "
             "mean [95% bootstrap interval over queries]", "",
             "| row | photo->photo R@1 | photo->photo MAP@R | photo->catalogue acc@1 | photo->catalogue, expanded | "
             f"R@1 vs off-the-shelf {size}px (paired) | R@1 vs own full dimension (paired) | "
             + ("vs the recipe (paired): R@1; expanded catalogue vs the recipe's plain | " if paired else "")
             + "R@1; expanded catalogue by fold | train wall / CPU s per fold |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if paired else "")]
    for s in summary:
        vs = s.get("recall_at_1_vs_off_the_shelf")
        diff = signed(vs) if vs and s["row"] != f"off-the-shelf {size}px" else ""
        own = signed(s["recall_at_1_vs_full"]) if "recall_at_1_vs_full" in s else ""
        by = "; ".join(" / ".join(f"{v[m]:.3f}" for v in s["by_fold"].values() if m in v)
                       for m in ("recall_at_1", "catalogue_expanded_at_1"))
        recipe_diff = ("; ".join(signed(v) for v in s["vs_recipe"].values()) if "vs_recipe" in s else "") + " | "
        t = " / ".join("kept run" if v.get("reused") else f"{v['wall_s']:.0f} / {v['cpu_s']:.0f}"
                       for v in s["train"].values()) or "-"
        expanded = ci(s["catalogue_expanded_at_1"]) if "catalogue_expanded_at_1" in s else "-"
        lines.append(f"| {s['row']} | {ci(s['recall_at_1'])} | {ci(s['map_at_r'])} | {ci(s['catalogue_at_1'])} "
                     f"| {expanded} | {diff} | {own} | {recipe_diff if paired else ''}{by} | {t} |")
    lines += ["", "Rows: " + "; ".join(f"{s['row']}: {s['what']}" for s in summary)]
    if fast:
        lines += ["", f"Training speed ({fast['batches']} batches of {fast['batch']}, {fast['num_workers']} DataLoader "
                  f"workers): trainer {fast['trainer_images_per_s']:.1f} images/s ({fast['trainer_cpu_s']:.0f} CPU s), "
                  f"bare loop on decoded batches {fast['bare_images_per_s']:.1f} images/s "
                  f"({fast['bare_cpu_s']:.0f} CPU s): ratio {fast['ratio']:.2f}; "
                  f"setup {fast.get('setup_cpu_s', 0):.0f} CPU s"
                  + (f" (the trunk cache: {fast['trunk_cache']} views of every training photo; both loops train on "
                     "cached trunk outputs)" if fast.get("trunk_cache") else "")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="*", default=list(FAMILIES), choices=list(FAMILIES),
                        help="loss families to fine-tune (pixels and off-the-shelf rows are always scored)")
    parser.add_argument("--folds", nargs="+", default=list(HALVES), choices=HALVES, help="held-out halves to run")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the Grocery Store folder")
    parser.add_argument("--epochs", type=int, help="epochs of every fine-tuning (default: the recipe's)")
    parser.add_argument("--size", type=int, help="training and test resolution in pixels (default: the recipe's)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="overrides of configs/grocery.yaml for every fine-tuning (e.g. optimizer.lr=3e-4)")
    parser.add_argument("--speed-batches", type=int, default=10, help="batches to time trainer vs bare loop (0: skip)")
    parser.add_argument("--dims", nargs="*", type=int, default=[], metavar="D",
                        help="also score each model projected to D dimensions by a PCA fit on the fold's training "
                             "photos (what `export --dim D` appends), e.g. --dims 512 256 128")
    parser.add_argument("--keep", type=Path, help="keep the trained runs in this folder (default: a temporary one)")
    parser.add_argument("--reuse", action="store_true",
                        help="with --keep: score the runs already there instead of training them again")
    parser.add_argument("--choose-on-val", type=float, default=0.0, metavar="F",
                        help="train each family without this fraction of its training classes (best.pt chosen on "
                             "them), add a row of the family and expansion rule they choose per fold and a row of "
                             "today's recipe on every class, paired to it, e.g. 0.25 with --families ms proxy_anchor "
                             "(default 0: every training class trains, the last epoch is scored)")
    parser.add_argument("--combine", nargs="+", type=Path, metavar="JSON",
                        help="no training: one table from earlier runs' results (e.g. one run per fold)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="write RESULTS.md and RESULTS.json")
    args = parser.parse_args(argv)
    extra = list(args.set)
    if args.epochs is not None:
        extra.append(f"epochs={args.epochs}")
    if args.size is not None:
        extra.append(f"model.preprocessing.size={args.size}")
    size = int(load_config(RECIPE, extra)["model"]["preprocessing"].get("size", 224))
    t0, c0 = time.perf_counter(), cpu_seconds()
    args.results.parent.mkdir(parents=True, exist_ok=True)
    partial = args.results.with_suffix(".partial.md")
    if args.combine:
        rows, fast = combine(args.combine)
    else:
        fast = speed(args.speed_batches, extra, args.data) if args.speed_batches else None
        rows = run(list(args.families), list(args.folds), args.data, extra, args.keep, partial, args.dims, args.reuse,
                   args.choose_on_val)
    summary = summarise(rows, size)
    text = table(summary, size, fast)
    text += f"\n\nCommand: python bench/photos.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    text += (f"\nTotal {time.perf_counter() - t0:.0f} s wall, {cpu_seconds() - c0:.0f} s CPU (user+sys) on "
             f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end.")
    print(text)
    partial.unlink(missing_ok=True)
    args.results.with_suffix(".md").write_text(text + "\n")
    raw = {r["row"]: {"what": r["what"], "train": r["train"],
                      "scores": {f: {m: v.tolist() for m, v in by.items()} for f, by in r["scores"].items()}}
           for r in rows}
    args.results.with_suffix(".json").write_text(json.dumps({"rows": summary, "speed": fast, "raw": raw}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
