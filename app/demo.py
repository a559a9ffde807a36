"""`metricsearch demo`: the whole chain on one data set, offline: train, export, index, evaluate, search, serve.

Everything goes under one work folder (run/, model.onnx, gallery/, demo.json); a second run
reuses each finished step and says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import metricsearch

STATE_FILE = "demo.json"
CONFIGS = Path(metricsearch.__file__).resolve().parent / "configs"


@dataclass
class DemoResult:
    """What a demo made and measured: paths, the test-split metrics, a sample search, the reused steps."""

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
    """The training config for `dataset`: configs/NAME.yaml when there is one, else the digits recipe."""
    from metricsearch.train import load_config

    recipe = CONFIGS / f"{dataset.partition(':')[0]}.yaml"
    config = load_config(recipe if recipe.is_file() else None)
    config.update(dataset=dataset, output_dir=str(workdir), name="run")
    return config


def run_demo(dataset: str = "digits", workdir: str | Path = "metricsearch-demo", *, serve: bool = True,
             host: str = "127.0.0.1", port: int = 7860, log: Callable[[str], None] = print) -> DemoResult:
    """Train, export, index the test classes, evaluate, search once, then (with `serve`) serve the page."""
    from metricsearch.index import evaluate_gallery
    from metricsearch.train import export_onnx, train

    workdir = Path(workdir)
    state = _State(workdir, dataset)
    run_dir, model, db = workdir / "run", workdir / "model.onnx", workdir / "gallery"
    reused: list[str] = []

    def step(n: int, name: str, saved: Any, what: str) -> bool:
        if saved is not None:
            reused.append(name)
            log(f"[{n}/5] {name}: reusing {what} (delete it to redo this step)")
        return saved is None

    if step(1, "train", state.done("train", run_dir), f"the run in {run_dir}"):
        log(f"[1/5] train: {dataset} into {run_dir}")
        resume = (run_dir / "last.pt").is_file()
        result = train(demo_config(dataset, workdir), resume=resume, overwrite=not resume, progress=True)
        state.finish("train", {"best_recall_at_1": result.best_recall_at_1, "epochs": result.epochs})
    if step(2, "export", state.done("export", model), f"the model {model}"):
        log(f"[2/5] export: {model}")
        report = export_onnx(run_dir, model)
        state.finish("export", {"max_abs_diff": report.max_abs_diff})
    if step(3, "index", state.done("index", db), f"the gallery {db}"):
        log(f"[3/5] index: the test classes of {dataset} into {db}")
        state.finish("index", _build_gallery(model, dataset, db))
    metrics = state.done("evaluate")
    if step(4, "evaluate", metrics, "the evaluation of the first run"):
        log(f"[4/5] evaluate: every item of {db} searches the others through the index")
        metrics = evaluate_gallery(db)
        state.finish("evaluate", metrics)
    log(_format_metrics(metrics))
    sample, examples = _sample_search(dataset, db, log)
    result = DemoResult(workdir, run_dir, model, db, metrics, sample, reused)
    if serve:
        from metricsearch.app.web import serve as serve_page

        log(f"[5/5] serve: {db}")
        serve_page(db, host, port, examples=examples, log=log)
    return result


def _build_gallery(model: Path, dataset: str, db: Path) -> dict[str, Any]:
    """Index the test classes of `dataset` into `db` (continuing a build that was cut short)."""
    from metricsearch.index import build_gallery

    summary = build_gallery(model, dataset, db, split="test", resume=db.exists(), overwrite=False)
    return {"count": summary.count, "failed": summary.failed, "index": summary.index}


def _format_metrics(metrics: dict[str, Any]) -> str:
    from metricsearch.app.cli import format_metrics

    return "evaluation on the test classes (each gallery item queries the others):\n" + format_metrics(metrics)


def _sample_search(dataset: str, db: Path, log: Callable[[str], None], k: int = 5) -> tuple[list[dict], list]:
    """One search with the first test image (printed), and one test image of each of the first classes."""
    from metricsearch.data import load_split
    from metricsearch.index import Gallery

    test = load_split(dataset).test
    first = {}
    for i, label in enumerate(test.labels.tolist()):
        first.setdefault(label, i)
    examples = [test.load(i) for i in list(first.values())[:8]]
    with Gallery.open(db) as gallery:
        hits = [{"id": h.id, "score": round(float(h.score), 4), "label": h.label}
                for h in gallery.search([test.load(0)], k)[0]]
    lines = [f"sample search: the first test image (label {test.class_names[test.labels[0]]}), {k} nearest:",
             "  rank  score   label  id"]
    lines += [f"  {r:<5} {h['score']:<7.4f} {h['label']!s:<6} {h['id']}" for r, h in enumerate(hits, 1)]
    log("\n".join(lines))
    return hits, examples
