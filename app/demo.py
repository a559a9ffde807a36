"""`metricsearch demo`: the whole chain on one data set, offline: train, export, index, evaluate, search, serve.

The default data set is Omniglot's two minimal background sets, embedded in the package: 4 alphabets
train, the 4 others are held out, indexed and evaluated, the trained model side by side with raw pixels.
Everything goes under one work folder (run/, model.onnx, gallery/, demo.json); a second run
reuses each finished step and says so.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import metricsearch

STATE_FILE = "demo.json"
OFF_THE_SHELF = "off-the-shelf.onnx"
CONFIGS = Path(metricsearch.__file__).resolve().parent / "configs"
#: the embedded default: Omniglot's minimal background sets, trained with configs/demo.yaml
DEFAULT_DATASET = "omniglot"
#: the one-shot episodes printed where the test images have alphabets (Omniglot), see evaluation.oneshot
ONE_SHOT_WAYS, ONE_SHOT_PROTOCOL = 20, "within_alphabet"


@dataclass
class DemoResult:
    """What a demo made and measured: paths, the test-split metrics ({"trained": ..., "pixels": ...}),
    a sample search, the reused steps."""

    workdir: Path
    run_dir: Path
    model: Path
    db: Path
    metrics: dict[str, Any]
    sample: list[dict[str, Any]]
    reused: list[str] = field(default_factory=list)


class _State:
    """demo.json: the data set the folder belongs to and what each finished step left."""

    def __init__(self, workdir: Path, dataset: str) -> None:
        self.path = workdir / STATE_FILE
        self.data: dict[str, Any] = {"dataset": dataset, "steps": {}}
        if self.path.is_file():
            saved = json.loads(self.path.read_text())
            if saved.get("dataset") != dataset:
                raise ValueError(f"{workdir} holds the demo of {saved.get('dataset')!r}, not {dataset!r}: "
                                 "pass another --workdir")
            self.data = saved

    def done(self, step: str, *outputs: Path) -> Any:
        """What a finished step saved, or None if it has to run (or its outputs are gone)."""
        saved = self.data["steps"].get(step)
        return saved if saved is not None and all(p.exists() for p in outputs) else None

    def finish(self, step: str, value: Any) -> None:
        self.data["steps"][step] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2))


def demo_config(dataset: str, workdir: Path) -> dict[str, Any]:
    """The training config for `dataset`: configs/demo.yaml for the embedded default, else configs/NAME.yaml
    when there is one, else the digits recipe; always with the data set's test classes held out."""
    from metricsearch.train import load_config

    recipe = CONFIGS / ("demo.yaml" if dataset == DEFAULT_DATASET else f"{dataset.partition(':')[0]}.yaml")
    config = load_config(recipe if recipe.is_file() else None)
    # the test classes stay out of training even where the recipe is a final fit (split: all):
    # the demo indexes them and evaluates on them
    config.update(dataset=dataset, output_dir=str(workdir), name="run", split="test")
    return config


def run_demo(dataset: str = DEFAULT_DATASET, workdir: str | Path = "metricsearch-demo", *, serve: bool = True,
             host: str = "127.0.0.1", port: int = 7860, log: Callable[[str], None] = print) -> DemoResult:
    """Train, export, index the test classes, evaluate the model and raw pixels on them, search once, then
    (with `serve`) serve the page, or (without) print the command that serves it."""
    from metricsearch.index import build_gallery

    workdir = Path(workdir)
    state = _State(workdir, dataset)
    run_dir, model, db = workdir / "run", workdir / "model.onnx", workdir / "gallery"
    reused: list[str] = []
    ran: list[str] = []
    again = "(delete it to redo this step and the ones after it)"

    def reuse(n: int, name: str, saved: Any, what: str) -> bool:
        """Whether step `name` can keep what an earlier demo left (never after a step that ran again)."""
        if saved is None or ran:
            ran.append(name)
            return False
        reused.append(name)
        log(f"[{n}/5] {name}: reusing {what}")
        return True

    if not reuse(1, "train", state.done("train", run_dir), f"the run {run_dir} {again}"):
        from metricsearch.train import train

        log(f"[1/5] train: {dataset} into {run_dir}")
        resume = (run_dir / "last.pt").is_file()  # a run cut short goes on where it stopped
        result = train(demo_config(dataset, workdir), resume=resume, overwrite=not resume, progress=True)
        state.finish("train", {"val_recall_at_1": result.val_recall_at_1, "epochs": result.epochs})
    exported = state.done("export", model)
    source = f", exported from {exported['checkpoint']}," if exported and "checkpoint" in exported else ""
    if not reuse(2, "export", exported, f"the model {model}{source} {again}"):
        from metricsearch.train import export_onnx

        checkpoint, why = _exported_checkpoint(run_dir)
        log(f"[2/5] export: {checkpoint} -> {model}\n      {checkpoint.name}: {why}")
        state.finish("export", {"checkpoint": str(checkpoint), "why": why,
                                "max_abs_diff": export_onnx(checkpoint, model, overwrite=True).max_abs_diff})
    if not reuse(3, "index", state.done("index", db), f"the gallery {db} {again}"):
        log(f"[3/5] index: the test classes of {dataset} into {db}")
        new_model = len(ran) > 1  # a new model makes a new gallery; else a build cut short goes on
        summary = build_gallery(model, dataset, db, part="test", resume=not new_model and db.exists(),
                                overwrite=new_model)
        photos = grocery_specs(dataset)
        if photos is not None:
            summary = _add_catalogue(db, photos["catalogue"], summary, log)
        state.finish("index", {"count": summary.count, "failed": summary.failed, "index": summary.index})
    metrics = state.done("evaluate", state.path)
    metrics = metrics if metrics is None or "pixels" in metrics else None  # a folder from before the comparison
    if not reuse(4, "evaluate", metrics, f"the evaluation saved in {state.path}"):
        log(f"[4/5] evaluate: the trained model and raw pixels on the test images indexed in {db}")
        metrics = compare_with_pixels(dataset, model)
        state.finish("evaluate", metrics)
    log(format_comparison(metrics))
    photos = grocery_specs(dataset)
    if photos is not None:
        compared = state.done("compare", workdir / OFF_THE_SHELF)
        if compared is None or ran:
            compared = compare_with_off_the_shelf(photos, model, workdir / OFF_THE_SHELF,
                                                  demo_config(dataset, workdir)["model"]["backbone"])
            state.finish("compare", compared)
        log(format_photo_comparison(compared))
    sample, examples = _sample_search(dataset, db, log)
    result = DemoResult(workdir, run_dir, model, db, metrics, sample, reused)
    if serve:
        from metricsearch.app.web import serve as serve_page

        log(f"[5/5] serve: {db}")
        serve_page(db, host, port, examples=examples, log=log)
    else:
        log(f"serve this gallery with:\n  metricsearch serve --db {shlex.quote(str(db))}")
    return result


def _exported_checkpoint(run_dir: Path) -> tuple[Path, str]:
    """The checkpoint the demo exports (best.pt, else last.pt) and why, from the run's metrics.jsonl: its epoch rows
    and its final record, the test classes scored once with best.pt."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    epochs = sum(1 for row in rows if row.get("epoch") and row.get("split") != "test")
    test = next((row for row in rows if row.get("split") == "test"), None)
    if test is None or not (run_dir / "best.pt").is_file():
        return run_dir / "last.pt", f"the last epoch ({epochs}); the run did not score its test classes"
    how = ("the last epoch, no validation classes" if test["chosen_by"] == "last epoch"
           else "the best Recall@1 on the validation classes")
    return run_dir / "best.pt", (f"epoch {test['epoch']} of {epochs}, {how}; Recall@1 {test['recall_at_k']['1']:.4f} "
                                 "on the test classes, scored once")


def compare_with_pixels(dataset: str, model: Path) -> dict[str, dict[str, Any]]:
    """Recall@K, NMI, MAP@R (and the 20-way one-shot error where the images have alphabets) of the exported
    `model` and of raw pixels at its input size, measured the same way on the data set's test images."""
    from metricsearch.data import load_split
    from metricsearch.evaluation import evaluate_split
    from metricsearch.models import OnnxEmbedder, PixelEmbedder

    split = load_split(dataset)
    trained = OnnxEmbedder(model, arena=False)  # batch jobs: see OnnxEmbedder
    pixels = PixelEmbedder(trained.preprocessing.size, trained.preprocessing.channels)
    ways = ONE_SHOT_WAYS if split.test.groups is not None else None
    return {name: evaluate_split(embedder.embed_set, split, one_shot_ways=ways,
                                 one_shot_protocol=ONE_SHOT_PROTOCOL if ways else None)
            for name, embedder in (("trained", trained), ("pixels", pixels))}


def format_comparison(metrics: dict[str, dict[str, Any]]) -> str:
    """The trained model's metrics beside the raw pixels', one metric a line."""
    trained, pixels = metrics["trained"], metrics["pixels"]
    rows = [(f"Recall@{k}", v, pixels["recall_at_k"][k]) for k, v in trained["recall_at_k"].items()]
    rows += [("NMI", trained["nmi"], pixels["nmi"]), ("MAP@R", trained["map_at_r"], pixels["map_at_r"])]
    one_shot = f"one_shot_{ONE_SHOT_WAYS}way_{ONE_SHOT_PROTOCOL}"
    if one_shot in trained:
        rows.append((f"{ONE_SHOT_WAYS}-way one-shot error, {ONE_SHOT_PROTOCOL.replace('_', ' ')} (lower is better)",
                     trained[one_shot]["error"], pixels[one_shot]["error"]))
    width = max(len(name) for name, _, _ in rows)
    lines = [f"evaluation on the {trained['n_queries']} test images (classes held out of training; each image "
             "queries the others):", f"  {'':<{width}} {'trained':>8} {'pixels':>8}"]
    lines += [f"  {name:<{width}} {t:>8.4f} {p:>8.4f}" for name, t, p in rows]
    return "\n".join(lines)


def _sample_search(dataset: str, db: Path, log: Callable[[str], None], k: int = 5) -> tuple[list[dict], list]:
    """Searches with the first test image of each of the first 8 test classes (printed); those images are the
    page's examples."""
    from metricsearch.data import load_split
    from metricsearch.index import Gallery

    test = load_split(dataset).test
    first: dict[int, int] = {}
    for i, label in enumerate(test.labels.tolist()):
        first.setdefault(label, i)
    rows = list(first.items())[:8]
    examples = [test.load(i) for _, i in rows]
    with Gallery.open(db) as gallery:
        found = gallery.search(examples, k)
    sample = [{"query_label": test.class_names[label], "hits": [h.to_dict() for h in hits]}
              for (label, _), hits in zip(rows, found)]
    which = "each test class" if len(rows) == len(first) else f"the first {len(rows)} of the {len(first)} test classes"
    lines = [f"sample searches: the first test image of {which} and its {k} nearest (label score #id); "
             "the image itself is in the gallery, so it comes first:"]
    lines += [f"  {row['query_label']:>8}: "
              + " | ".join(f"{h['label']} {h['score']:.3f} #{h['id']}" for h in row["hits"])
              for row in sample]
    log("\n".join(lines))
    return sample, examples


def grocery_specs(dataset: str) -> dict[str, str] | None:
    """For a `grocery:PATH[#halfN]` demo, the held-out half's specs: query photos (test list), photo gallery
    (train+val lists) and catalogue images; None for other data sets."""
    from metricsearch.data.grocery import HALVES, parse

    name, _, rest = dataset.partition(":")
    if name != "grocery":
        return None
    root, selection = parse(Path(rest))
    base, half = f"grocery:{root}", selection.half or HALVES[1]
    return {"query": f"{base}#test,{half}", "gallery": f"{base}#train+val,{half}",
            "catalogue": f"{base}#catalogue,{half}"}


def _add_catalogue(db: Path, catalogue: str, summary: Any, log: Callable[[str], None]) -> Any:
    """Index the held-out classes' catalogue images beside their photos; the build summary with them counted."""
    from dataclasses import replace

    from metricsearch.index import add_images

    added = add_images(db, catalogue)
    log(f"      + {added.indexed} catalogue images of the held-out classes")
    return replace(summary, count=added.count, failed=summary.failed + added.failed)


def compare_with_off_the_shelf(photos: dict[str, str], model: Path, baseline: Path, backbone: str) -> dict[str, Any]:
    """Photo -> photo Recall@1 and MAP@R, photo -> catalogue accuracy@1 (also with the catalogue expanded by the
    photo gallery, `evaluate --expand-with`) on the held-out classes, of the backbone's off-the-shelf ImageNet
    features (exported to `baseline`) and of the fine-tuned `model`."""
    from metricsearch.data import load_query_gallery
    from metricsearch.evaluation import evaluate
    from metricsearch.evaluation.expansion import expand_gallery
    from metricsearch.models import OnnxEmbedder
    from metricsearch.train import export_pretrained

    if not baseline.is_file():
        export_pretrained(backbone, baseline, images=photos["query"])
    queries, gallery = load_query_gallery(photos["query"], photos["gallery"])
    shop_queries, catalogue = load_query_gallery(photos["query"], photos["catalogue"])  # the same photos
    figures: dict[str, Any] = {}
    for name, path in (("off-the-shelf", baseline), ("fine-tuned", model)):
        embedder = OnnxEmbedder(path, arena=False)
        q, g, c = (embedder.embed_set(images) for images in (queries, gallery, catalogue))  # each set once
        photo = evaluate(q, queries.labels, g, gallery.labels, (1,), with_nmi=False)
        shop = evaluate(q, shop_queries.labels, c, catalogue.labels, (1,), with_nmi=False)
        expanded = evaluate(q, shop_queries.labels, expand_gallery(c, g), catalogue.labels, (1,), with_nmi=False)
        figures[name] = {"photo_recall_at_1": photo["recall_at_k"][1], "photo_map_at_r": photo["map_at_r"],
                         "catalogue_accuracy_at_1": shop["recall_at_k"][1],
                         "catalogue_expanded_at_1": expanded["recall_at_k"][1]}
    return figures


def format_photo_comparison(figures: dict[str, Any]) -> str:
    """The off-the-shelf and fine-tuned figures side by side."""
    rows = (("photo -> photo Recall@1", "photo_recall_at_1"), ("photo -> photo MAP@R", "photo_map_at_r"),
            ("photo -> catalogue accuracy@1", "catalogue_accuracy_at_1"),
            ("photo -> catalogue, expanded", "catalogue_expanded_at_1"))
    lines = ["held-out classes: off-the-shelf ImageNet features vs fine-tuned",
             f"  {'':30} {'off-the-shelf':>13} {'fine-tuned':>10}"]
    lines += [f"  {label:30} {figures['off-the-shelf'][key]:13.3f} {figures['fine-tuned'][key]:10.3f}"
              for label, key in rows]
    return "\n".join(lines)
