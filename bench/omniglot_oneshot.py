"""Omniglot one-shot, cross-validated over alphabets: how good is a recipe on alphabets it never saw?

The shipped recipe `configs/omniglot.yaml` is a final fit (all 8 background alphabets train, nothing
held out). This script measures recipes by 2-fold cross-validation over the 8 alphabets of the two
minimal background sets (alphabets sorted by name, every second one in fold A's test):

* fold A (`split=test`): train Balinese, Greek, Korean, Sanskrit; test Early_Aramaic,
  Japanese (katakana), Latin, Tagalog;
* fold B (`split=swap`): the other way round.

Each recipe trains once per fold on every class of the fold's training alphabets (`val_classes=0`: none validates);
its last epoch (never a test-selected best) embeds the fold's test alphabets, and the script scores 20-way
one-shot episodes of two protocols (evaluation/oneshot.py):
`within_alphabet` (the official protocol of Lake et al. 2015: 20 characters of one alphabet, support
and query by two different drawers; Tagalog, with 17 characters, cannot hold a 20-way episode and is
left out of it) and `across_alphabets` (20 characters from anywhere, easier). Episodes of both folds
are pooled: error = mean episode error, with its 95% confidence interval; "vs current" is the paired
difference to the current recipe (or the `--ref` row) on the very same episodes. The raw-pixel baseline
needs no training. `--views LABEL VIEWS` adds rows of the same weights scored with other test-time views;
`--seeds N` trains every recipe with N seeds and adds the paired differences over seeds, whose intervals
also cover the training's own noise (one seed moves the error by up to half a point); `--scored` joins the
rows of an earlier run's RESULTS.json to that table instead of training them again; `--ensemble LABEL A+B`
adds a row of rows A and B trained here, their embeddings side by side scored as one model.

Run: `python bench/omniglot_oneshot.py` (all rows; 21.5 minutes on 2 idle cores, hours on busy
ones: `--scale 0.25` trains every recipe for a quarter of its epochs), or
`--recipes current final` for a subset (`--recipes` alone: only the `--add` rows). Prints one line per training,
then a markdown table; writes it with the raw numbers to bench/results/omniglot_oneshot.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy import stats

from metricsearch.data import DataSplit, ImageSet, load_split
from metricsearch.evaluation.distances import check_center
from metricsearch.evaluation.oneshot import episode_errors, mean_ci
from metricsearch.models import PixelEmbedder
from metricsearch.models.onnx_embedder import OnnxEmbedder
from metricsearch.models.torch_embedder import Embedder, load_embedder
from metricsearch.train.config import VIEW_KEYS, load_config  # VIEW_KEYS: a kept run is scored with others
from metricsearch.train.export import export_onnx
from metricsearch.train.quantize import quantize_onnx
from metricsearch.train.checkpoint_data import sample_batch
from metricsearch.train.trainer import train
from metricsearch.train.whitening import whitened
from results_files import write_results

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "omniglot"
FINAL_CONFIG = REPO / "configs" / "omniglot.yaml"
RESULTS = REPO / "bench" / "results" / "omniglot_oneshot"
FOLDS = {"A": "test", "B": "swap"}

#: configs/omniglot.yaml before the one-shot work (commit e656d28): 4 alphabets, held-out test
CURRENT = """
name: omniglot
model:
  backbone: small_cnn
  dim: 128
  normalize: true
  preprocessing: {size: 28, channels: 1, mean: [0.9], std: [0.3], resize: stretch}
augment: {name: affine, degrees: 10, translate: [0.08, 0.08], scale: [0.9, 1.1], shear: 5, fill: 255}
sampler: {name: group, classes_per_batch: 32, images_per_class: 4}
loss: {name: ms, alpha: 2.0, beta: 50.0, base: 0.5, epsilon: 0.1}
optimizer: {name: adamw, lr: 0.002, head_lr: 0.002, weight_decay: 0.0001}
schedule: {name: cosine, warmup_epochs: 1}
epochs: 60
eval: {every: 5, batch_size: 512, nmi: true, one_shot_ways: 20}
"""

#: row name -> (base: "current" or "final", overrides, what it tries). Rows that change one thing of
#: the current recipe, then the final recipe and ablations of it. "final" rows also get a "no TTA"
#: twin for free (the same trained weights, scored without the test-time shifted views).
RECIPES: dict[str, tuple[str, list[str], str]] = {
    "current": ("current", [], "configs/omniglot.yaml before this work"),
    "final": ("final", [], "configs/omniglot.yaml (the shipped recipe)"),
}


def recipe_config(name: str, base: str, overrides: list[str], fold: str, data: Path, out: Path,
                  scale: float = 1.0) -> dict[str, Any]:
    """The training config of one recipe on one fold: every class of the fold's training alphabets trains, none
    validates (`val_classes=0`: best.pt is the last epoch, as the final fit keeps), the trainer scores the test
    alphabets once at the end (this script scores them itself); `scale` multiplies its epochs (a shorter schedule for
    every recipe alike). `eval.every` stays as runs kept before issue 88 saved it, so that `--reuse` resumes them."""
    fixed = [f"dataset=omniglot:{data}", f"split={FOLDS[fold]}", "val_classes=0", f"output_dir={out}",
             f"name={name}-{fold}", "eval.every=100000", "eval.nmi=false", "eval.one_shot_ways=null"]
    if base == "current":
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(CURRENT)
        try:
            config = load_config(f.name, [*overrides, *fixed])
        finally:
            os.unlink(f.name)
    else:
        config = load_config(FINAL_CONFIG, [*overrides, *fixed])
    config["epochs"] = max(1, round(int(config["epochs"]) * scale))
    return config


def score(x: np.ndarray, test: ImageSet, episodes: int, center: float = 0.0) -> dict[str, np.ndarray]:
    """Per-episode 20-way errors of both protocols (seeded: every recipe sees the same episodes), the embeddings
    centred by `center` times each episode's mean support embedding (evaluation.oneshot)."""
    return {protocol: episode_errors(x, test.labels, test.groups, test.sources, 20, protocol, episodes, seed=0,
                                     center=center) for protocol in ("within_alphabet", "across_alphabets")}


def twin_labels(views: dict[str, Any], center: float, whiten: float = 0.0, int8: bool = False) -> list[str]:
    """The labels of a recipe's twin rows: `no TTA` and the other views, then `centred C` with a center,
    `whitened P` with a whitening power and `int8` for an int8 copy."""
    return [*views, *([f"centred {center:g}"] if center else []), *([f"whitened {whiten:g}"] if whiten else []),
            *(["int8"] if int8 else [])]


def int8_embeddings(model: Embedder, split: DataSplit, folder: Path) -> np.ndarray:
    """The test drawings embedded by an int8 ONNX copy of `model` (train/quantize.py), calibrated on the training
    drawings; both graphs are written to `folder`."""
    f32, copy = folder / "bench_float32.onnx", folder / "bench_int8.onnx"
    export_onnx(model, f32, sample_batch(model.preprocessing, split.test, 32), overwrite=True)
    quantize_onnx(f32, copy, split.train, overwrite=True)
    return OnnxEmbedder(copy, device="cpu").embed_set(split.test)


def run(recipes: list[str], data: Path, episodes: int, extra: list[str], folds: list[str], scale: float = 1.0,
        keep: Path | None = None, ref: str = "current",
        views: dict[str, dict[str, list]] | None = None, reuse: bool = False,
        center: float = 0.0, ensembles: dict[str, list[str]] | None = None,
        whiten: float = 0.0, int8: bool = False) -> list[dict[str, Any]]:
    """Train and score every recipe fold by fold; recipes with test-time views also get one twin row per
    entry of `views` (label -> {"shifts": [[dx, dy], ...], "rotations": [degrees, ...], "symmetries": [names]};
    `no TTA` = none): the same weights scored with those views (a whitened recipe's matrix fit again with them, as
    its training would); with `center`, every recipe also gets a twin row `centred C` (C = `center`): its own
    embeddings scored with episodes centred on their support images; with `whiten` P, a twin row `whitened P`: the
    same weights whitened (train/whitening.py, power P) on the fold's training alphabets; with `int8`, a twin row
    `int8`: the recipe's int8 ONNX copy (`metricsearch quantize`, calibrated on the fold's training alphabets).
    With `reuse`, a run already finished in `keep` under the same config (test-time views aside) is scored
    with the recipe's views, not trained again. `ensembles` (label -> member recipes) adds a row per label: the
    members' L2-normalised embeddings side by side, over the square root of their number (the mean of their
    cosine similarities), its training time the sum of theirs."""
    views = {"no TTA": {"shifts": [], "rotations": [], "symmetries": []}, **(views or {})}
    splits = {fold: load_split(f"omniglot:{data}", split=FOLDS[fold]) for fold in folds}
    rows: list[dict[str, Any]] = []
    pixels = PixelEmbedder(28)
    rows.append({"recipe": "pixels", "what": "raw 28x28 pixels, no training", "train_s": {},
                 "errors": {fold: score(pixels.embed_set(s.test), s.test, episodes) for fold, s in splits.items()}})
    trained = [{"recipe": name, "what": RECIPES[name][2], "train_s": {}, "load": {}, "errors": {}} for name in recipes]
    ensembles = ensembles or {}
    joined = {m for names in ensembles.values() for m in names}  # the rows whose embeddings an ensemble joins
    combined = [{"recipe": label, "what": f"ensemble of {' + '.join(members)}", "train_s": {}, "errors": {}}
                for label, members in ensembles.items()]
    centred = twin_labels({}, center)  # one label with a center, none without
    white = twin_labels({}, 0.0, whiten)
    quantized = twin_labels({}, 0.0, 0.0, int8)
    kinds = [  # each kind of twin row: its labels and what they say
        {label: f"same weights, test-time views {spec if any(spec.values()) else 'off'}"
         for label, spec in views.items()},
        {label: f"same embeddings, episodes centred by {center:g} x the support mean" for label in centred},
        {label: f"same weights, whitened with power {whiten:g} on the training alphabets" for label in white},
        {label: "same weights, an int8 ONNX copy calibrated on the training alphabets" for label in quantized},
    ]
    twins = {(name, label): {"recipe": f"{name}, {label}", "train_s": row["train_s"], "errors": {}, "what": what}
             for kind in kinds for name, row in zip(recipes, trained) for label, what in kind.items()}
    with tempfile.TemporaryDirectory(prefix="omniglot_oneshot_") as tmp:
        out = keep or Path(tmp)
        # fold by fold: a stopped run still compares recipes on whole folds
        for k, (fold, split) in enumerate(splits.items()):
            embeddings: dict[str, np.ndarray] = {}
            for name, row in zip(recipes, trained):
                base, overrides, _ = RECIPES[name]
                config = recipe_config(name, base, [*overrides, *extra], fold, data, out, scale)
                row["epochs"] = config["epochs"]
                row["load"][fold] = os.getloadavg()[0]
                timing = out / f"{name}-{fold}" / "bench_train_s.json"
                again = reuse and timing.is_file()  # written only once a training has finished
                recipe_views = {"shifts": config["model"]["tta_shifts"],
                                "rotations": config["model"]["tta_rotations"],
                                "symmetries": config["model"]["tta_symmetries"]}
                if again:  # the kept run may have other test-time views: resume it with its own, score with these
                    kept = yaml.safe_load((timing.parent / "config.yaml").read_text())["model"]
                    config["model"] |= {key: kept.get(key, []) for key in VIEW_KEYS}
                t0 = time.perf_counter()
                result = train(config, progress=False, resume=again)  # resuming a finished run trains nothing
                row["train_s"][fold] = json.loads(timing.read_text()) if again else time.perf_counter() - t0
                timing.write_text(json.dumps(row["train_s"][fold]))
                model = load_embedder(result.run_dir / "last.pt")
                model.set_views(recipe_views["shifts"], recipe_views["rotations"], recipe_views["symmetries"])
                x = model.embed_set(split.test)
                if name in joined:
                    embeddings[name] = x / np.linalg.norm(x, axis=1, keepdims=True)
                row["errors"][fold] = score(x, split.test, episodes)
                for label in centred:
                    twins[name, label]["epochs"] = config["epochs"]
                    twins[name, label]["errors"][fold] = score(x, split.test, episodes, center)
                for label in white:
                    twins[name, label]["epochs"] = config["epochs"]
                    white_model = whitened(model, split.train, whiten)
                    twins[name, label]["errors"][fold] = score(white_model.embed_set(split.test), split.test, episodes)
                for label in quantized:
                    twins[name, label]["epochs"] = config["epochs"]
                    x8 = int8_embeddings(model, split, result.run_dir)
                    twins[name, label]["errors"][fold] = score(x8, split.test, episodes)
                tta = model.tta_shifts or model.tta_rotations or model.tta_symmetries
                for label, spec in views.items() if tta else ():
                    model.set_views(spec["shifts"], spec["rotations"], spec["symmetries"])
                    # a whitened recipe's matrix is fit with its views: fit it again with these, as training would
                    viewed = whitened(model, split.train, model.whiten) if model.whiten else model
                    twins[name, label]["epochs"] = config["epochs"]
                    twins[name, label]["errors"][fold] = score(viewed.embed_set(split.test), split.test, episodes)
                e = row["errors"][fold]
                print(f"{name} fold {fold}: {row['train_s'][fold]:.0f} s (load {row['load'][fold]:.1f}), "
                      f"within {e['within_alphabet'].mean():.4f}, across {e['across_alphabets'].mean():.4f}",
                      file=sys.stderr, flush=True)
            for (label, members), row in zip(ensembles.items(), combined):
                x = np.concatenate([embeddings[m] for m in members], axis=1) / np.sqrt(len(members))
                row["errors"][fold] = score(x, split.test, episodes)
                row["train_s"][fold] = sum(r["train_s"][fold] for r in trained if r["recipe"] in members)
                row["epochs"] = trained[recipes.index(members[0])]["epochs"]
            done = list(splits)[:k + 1]
            partial = [{**rows[0], "errors": {f: rows[0]["errors"][f] for f in done}}, *trained, *combined,
                       *(t for t in twins.values() if t["errors"])]
            print(table(summarise(partial, ref), episodes, ref), file=sys.stderr, flush=True)
    for name, row in zip(recipes, trained):
        rows += [row, *(twins[name, label] for label in twin_labels(views, center, whiten, int8)
                        if twins[name, label]["errors"])]
    return rows + combined


def summarise(rows: list[dict[str, Any]], ref: str = "current") -> list[dict[str, Any]]:
    """Pooled errors with CIs, and paired differences to the `ref` row."""
    folds = list(rows[0]["errors"])
    pooled = {r["recipe"]: {p: np.concatenate([r["errors"][f][p] for f in folds]) for p in
                            ("within_alphabet", "across_alphabets")} for r in rows}
    reference = pooled.get(ref)
    out = []
    for r in rows:
        e = pooled[r["recipe"]]
        item = {"recipe": r["recipe"], "what": r["what"], "epochs": r.get("epochs"),
                "train_s": {f: round(t, 1) for f, t in r["train_s"].items()},
                "load": {f: round(v, 2) for f, v in r.get("load", {}).items()}}
        for p, values in e.items():
            item[p] = mean_ci(values)
            item[f"{p}_by_fold"] = {f: float(r["errors"][f][p].mean()) for f in folds}
            if reference is not None:
                item[f"{p}_vs_ref"] = mean_ci(values - reference[p], clip=None)
        out.append(item)
    return out


def table(summary: list[dict[str, Any]], episodes: int, ref: str = "current") -> str:
    def ci(v) -> str:
        return f"{100 * v[0]:.1f} [{100 * v[1]:.1f}, {100 * v[2]:.1f}]"

    def diff(v) -> str:
        return f"{100 * v[0]:+.1f} [{100 * v[1]:+.1f}, {100 * v[2]:+.1f}]"

    lines = [
        f"20-way one-shot error in % [95% CI], both folds pooled ({episodes} episodes per fold and protocol)",
        "",
        f"| recipe | epochs | within-alphabet error | fold A / B | vs {ref} (paired) | across-alphabet error | "
        "train time (s), fold A + B |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        folds = " / ".join(f"{100 * v:.1f}" for v in s["within_alphabet_by_fold"].values())
        vs = diff(s["within_alphabet_vs_ref"]) if "within_alphabet_vs_ref" in s and s["recipe"] != ref else ""
        t = " + ".join(f"{v:.0f}" for v in s["train_s"].values()) or "-"
        lines.append(f"| {s['recipe']} | {s['epochs'] or '-'} | {ci(s['within_alphabet'])} | {folds} | {vs} | "
                     f"{ci(s['across_alphabets'])} | {t} |")
    lines += ["", "Rows: " + "; ".join(f"{s['recipe']}: {s['what']}" for s in summary)]
    return "\n".join(lines)


def seed_table(summary: list[dict[str, Any]], seeds: dict[str, list[str]], ref: str, folds: list[str],
               first_seed: int = 0) -> str:
    """Within-alphabet error per seed (columns named by the seeds, `first_seed` on) over `folds` (rows scored on
    more folds count those alone; rows without one are left out), and the paired difference to `ref` seed by seed,
    pooled and for each fold, with a Student t 95% interval over the seeds: it covers the training's own noise,
    which the episode intervals do not."""
    rows = {s["recipe"]: s for s in summary if set(folds) <= set(s["within_alphabet_by_fold"])}
    n = len(seeds[ref])

    def errors(members: list[str], fold: str | None = None) -> np.ndarray:  # folds pooled: equal episodes each
        return np.array([100 * np.mean([rows[m]["within_alphabet_by_fold"][f] for f in ([fold] if fold else folds)])
                         for m in members])

    def paired(members: list[str], fold: str | None = None) -> str:
        d = errors(members, fold) - errors(seeds[ref], fold)
        half = stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / np.sqrt(n)
        return f"{d.mean():+.2f} [{d.mean() - half:+.2f}, {d.mean() + half:+.2f}]"

    by_fold = "".join(f" vs {ref}, fold {f} |" for f in folds)
    lines = [f"Within-alphabet error in % by seed; vs {ref}: mean of the {n} seed-by-seed differences, [t 95% CI], "
             f"fold{'s' * (len(folds) > 1)} {' and '.join(folds)} pooled and each fold alone",
             "", f"| recipe | {' | '.join(f'seed {first_seed + k}' for k in range(n))} | mean | vs {ref} |{by_fold}",
             f"|---|{'---:|' * (n + 2 + len(folds))}"]
    for name, members in seeds.items():
        if not all(m in rows for m in members):
            continue
        values = errors(members)
        vs = " | ".join([paired(members), *(paired(members, f) for f in folds)]) if name != ref else " |" * len(folds)
        lines.append(f"| {name} | {' | '.join(f'{v:.1f}' for v in values)} | {values.mean():.2f} | {vs} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", nargs="*", default=list(RECIPES), choices=list(RECIPES),
                        help="recipes to train (the pixel baseline is always scored); none: the --add rows only")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of the Omniglot background sets")
    parser.add_argument("--episodes", type=int, default=2000, help="episodes per fold and protocol")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="overrides for every trained recipe (e.g. epochs=5 for a smoke run)")
    parser.add_argument("--add", nargs=3, action="append", default=[], metavar=("NAME", "BASE", "OVERRIDES"),
                        help="an extra row: name, base (current|final), ';'-separated KEY=VALUE overrides")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every recipe's epochs by this (e.g. 0.25 for a quick ranking on busy cores)")
    parser.add_argument("--ref", default="current", help="the row that paired differences are taken against")
    parser.add_argument("--views", nargs=2, action="append", default=[], metavar=("LABEL", "VIEWS"),
                        help="an extra twin of every recipe with test-time views: the same weights scored with "
                             "these views, a JSON list of shifts [dx, dy] (e.g. '[[0, 0], [1, 0]]') or an object "
                             "with shifts, rotations in degrees and symmetric copies put beside (model."
                             "tta_symmetries; e.g. '{\"shifts\": [[0, 0]], \"rotations\": [-15, 15], "
                             "\"symmetries\": [\"transpose\"]}')")
    parser.add_argument("--center", type=float, default=0.0, metavar="C",
                        help="also score every recipe with one-shot episodes centred on their support images: C "
                             "times the mean support embedding taken from each embedding (evaluation.oneshot)")
    parser.add_argument("--whiten", type=float, default=0.0, metavar="P",
                        help="also score every recipe whitened (model.whiten: P in (0, 1]) on its fold's training "
                             "alphabets, the same weights (train/whitening.py)")
    parser.add_argument("--int8", action="store_true",
                        help="also score every recipe's int8 ONNX copy (metricsearch quantize), calibrated on its "
                             "fold's training alphabets")
    parser.add_argument("--keep", type=Path, help="keep the trained runs in this folder (default: a temporary one)")
    parser.add_argument("--reuse", action="store_true",
                        help="score runs already finished in --keep under the same config instead of training "
                             "them again (their training times are the ones measured then)")
    parser.add_argument("--seeds", type=int, default=1,
                        help="train every recipe with seeds 0..N-1 (S..S+N-1 for a row with seed=S; rows NAME, "
                             "NAMEs1, ...; an --ensemble's seed k joins its members' seed k) and add a table of the "
                             "paired differences to --ref over the seeds, with t intervals (N >= 2)")
    parser.add_argument("--scored", type=Path, action="append", default=[], metavar="RESULTS.json",
                        help="rows already scored by an earlier run of this script with the same data and "
                             "episodes (its RESULTS.json): those recipes are not trained again and join the seed "
                             "table, so `--seeds 8 --scored FOUR_SEEDS.json` trains seeds 4-7 only")
    parser.add_argument("--ensemble", nargs=2, action="append", default=[], metavar=("LABEL", "MEMBERS"),
                        help="an extra row: the embeddings of trained rows side by side ('+'-separated, e.g. "
                             "'w32+w32s1'), each L2-normalised, as one model (the mean of their cosine similarities)")
    parser.add_argument("--folds", nargs="+", default=list(FOLDS), choices=list(FOLDS), help="folds to run")
    parser.add_argument("--results", type=Path, default=RESULTS, help="write RESULTS.md and RESULTS.json")
    args = parser.parse_args(argv)
    recipes = list(args.recipes)
    for name, base, overrides in args.add:
        RECIPES[name] = (base, [o for o in overrides.split(";") if o], f"{base} + {overrides}")
        recipes.append(name)
    if args.seeds < 1:
        parser.error(f"--seeds must be 1 or more, got {args.seeds}")
    seeds = {name: [name, *(f"{name}s{k}" for k in range(1, args.seeds))] for name in recipes}
    first_seeds = {}
    for name in list(recipes):
        base, overrides, what = RECIPES[name]
        first = first_seeds[name] = int(next((o.split("=", 1)[1] for o in reversed(overrides)
                                              if o.startswith("seed=")), 0))
        for k in range(1, args.seeds):
            RECIPES[f"{name}s{k}"] = (base, [*overrides, f"seed={first + k}"], f"{what}; seed={first + k}")
        recipes += seeds[name][1:]
    if args.reuse and args.keep is None:
        parser.error("--reuse needs --keep FOLDER, the folder of the earlier runs")
    if args.ref not in ("pixels", *recipes):
        parser.error(f"--ref {args.ref} is not among the rows: pixels, {', '.join(recipes)}")
    missing = [str(path) for path in args.scored if not path.is_file()]
    if missing:
        parser.error(f"--scored: no such file: {', '.join(missing)}")
    earlier = [row for path in args.scored for row in json.loads(path.read_text())]
    recipes = [name for name in recipes if name not in {row["recipe"] for row in earlier}]
    ensembles = {label: members.split("+") for label, members in args.ensemble}
    for label, members in list(ensembles.items()):  # seed k of an ensemble: seed k of each member
        seeds[label] = [label, *(f"{label}s{k}" for k in range(1, args.seeds))]
        ensembles |= {f"{label}s{k}": [f"{m}s{k}" if m in seeds else m for m in members] for k in range(1, args.seeds)}
    unknown = [m for members in ensembles.values() for m in members if m not in recipes]
    if unknown:
        parser.error(f"--ensemble: {', '.join(unknown)} not among the rows trained here: {', '.join(recipes)}")
    t0 = time.perf_counter()
    views = {}
    for label, text in args.views:
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as e:
            parser.error(f"--views {label}: not JSON ({e})")
        spec = {"shifts": spec} if isinstance(spec, list) else spec
        if not isinstance(spec, dict) or set(spec) - {"shifts", "rotations", "symmetries"}:
            parser.error(f"--views {label}: give a JSON list of shifts or an object with shifts, rotations and "
                         "symmetries")
        views[label] = {"shifts": spec.get("shifts", []), "rotations": spec.get("rotations", []),
                        "symmetries": spec.get("symmetries", [])}
    try:
        check_center(args.center)
    except ValueError as e:
        parser.error(f"--center: {e}")
    if not 0 <= args.whiten <= 1:
        parser.error(f"--whiten: give a power in (0, 1], got {args.whiten:g}")
    rows = run(recipes, args.data, args.episodes, args.set, args.folds, args.scale, args.keep, args.ref, views,
               args.reuse, args.center, ensembles, args.whiten, args.int8)
    summary = summarise(rows, args.ref)
    text = table(summary, args.episodes, args.ref)
    if args.seeds > 1 and args.ref in seeds:
        labels = ["", *(f", {label}" for label in twin_labels({"no TTA": {}, **views}, args.center, args.whiten,
                                                                      args.int8))]
        text += "\n\n" + seed_table([*earlier, *summary], {f"{name}{label}": [f"{m}{label}" for m in members]
                                               for name, members in seeds.items() for label in labels}, args.ref,
                                 args.folds, first_seeds.get(ensembles.get(args.ref, [args.ref])[0], 0))
    text += f"\n\nCommand: python bench/omniglot_oneshot.py {shlex.join(argv if argv is not None else sys.argv[1:])}"
    text += f"\nTotal wall time {time.perf_counter() - t0:.0f} s on {os.cpu_count()} cores."
    print(text)
    write_results(args.results, text, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
