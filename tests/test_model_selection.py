"""Model selection never looks at the test classes (issue 88): best.pt is chosen on validation classes carved out of
the training classes (`val_classes`), or is the last epoch where they would be too few; the test classes are scored
once, at the end, with best.pt; a pretrained run compares its fine-tuned features with the off-the-shelf ones."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from metricsearch.app.cli import main
from metricsearch.data import load_split
from metricsearch.evaluation import evaluate_model
from metricsearch.evaluation.run import evaluate_split
from metricsearch.models.torch_embedder import Embedder, build_embedder, load_embedder
from metricsearch.train import scoring
from metricsearch.train.config import load_config, typed_config
from metricsearch.train.trainer import RunState, build_setup, closing_lines, train

#: digits with 2 of its 5 training classes validating, a few short epochs
VALIDATED = ["val_classes=0.4", "sampler.classes_per_batch=3", "epochs=3", "batches_per_epoch=2", "eval.nmi=false"]


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_validation_classes_are_seeded_and_disjoint_from_training_and_test_classes() -> None:
    for seed in range(4):
        split = load_split("digits", val_classes=0.4, seed=seed)
        train_names, val_names, test_names = (set(s.class_names) for s in (split.train, split.val, split.test))
        assert len(val_names) == 2 and len(train_names) == 3 and train_names | val_names == set("01234")
        assert not train_names & val_names and not (train_names | val_names) & test_names
        assert sorted(split.train.class_names[k] for k in set(split.train.labels)) == sorted(train_names)
        assert load_split("digits", val_classes=0.4, seed=seed).val.class_names == split.val.class_names
    assert len({tuple(load_split("digits", val_classes=0.4, seed=s).val.class_names) for s in range(8)}) > 1
    swapped = load_split("digits", split="swap", val_classes=0.4)
    assert set(swapped.val.class_names) < set("56789")
    final = load_split("digits", split="all", val_classes=0.4)  # a final fit: every class trains
    assert final.val is None and len(final.train.class_names) == 10
    assert "val_classes is 0" in load_split("digits", val_classes=0.0).notes[-1]


def test_best_pt_is_chosen_on_the_validation_classes_and_the_test_classes_are_scored_once_at_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(None, [*VALIDATED, f"output_dir={tmp_path}"])
    setup = build_setup(typed_config(config))
    parts = [set(setup.split.train.class_names), set(setup.split.val.class_names), set(setup.split.test.class_names)]
    assert parts[0] == set(setup.dataset.images.class_names) and len(parts[1]) == 2  # the steps draw training images
    assert not parts[0] & parts[1] and not parts[0] & parts[2] and not parts[1] & parts[2]
    evaluated: list[set[str]] = []

    def recorded(embed, split, *args, **kwargs):
        evaluated.append({split.test.class_names[k] for k in set(split.test.labels)})
        return evaluate_split(embed, split, *args, **kwargs)

    monkeypatch.setattr(scoring, "evaluate_split", recorded)
    result = train(config, progress=False)
    assert evaluated == [parts[1]] * 3 + [parts[2]]  # the test classes once, after the last epoch
    rows = _rows(result.run_dir)
    epochs, test = rows[:-1], rows[-1]
    assert [row["epoch"] for row in epochs] == [1, 2, 3]
    assert all(row["split"] == "val" and row["classes"] == 2 for row in epochs)
    scores = [(row["recall_at_k"]["1"], row["map_at_r"]) for row in epochs]
    chosen = scores.index(max(scores)) + 1  # the first of equals
    best = torch.load(result.run_dir / "best.pt", weights_only=False)
    assert best["epoch"] == chosen and result.val_recall_at_1 == scores[chosen - 1][0]
    assert test["split"] == "test" and test["epoch"] == chosen and test["chosen_by"] == "validation Recall@1"
    assert test["classes"] == 5 and result.test["recall_at_k"][1] == test["recall_at_k"]["1"]
    again = evaluate_model(load_embedder(result.run_dir / "best.pt"), dataset="digits", with_nmi=False)
    assert again["recall_at_k"][1] == pytest.approx(test["recall_at_k"]["1"], abs=1e-6)  # best.pt scored it


def test_with_too_few_classes_the_last_epoch_is_kept_and_the_run_says_so(tmp_path: Path, capsys) -> None:
    args = ["train", "--output-dir", str(tmp_path), "--epochs", "2", "--set", "batches_per_epoch=2", "eval.nmi=false"]
    assert main([*args, "--stop-after-epoch", "1"]) == 0  # digits: 5 training classes, 1 would validate at 0.2
    paused = capsys.readouterr().out
    assert "data: no validation classes: at val_classes 0.2, 1 of the 5 training classes would validate" in paused
    assert "test: " not in paused and all("split" not in row for row in _rows(tmp_path / "digits"))
    assert main([*args, "--resume"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^test: R@1 \d\.\d{3}  MAP@R \d\.\d{3} on the 5 held-out test classes, scored once with "
                     r"best\.pt \(the last epoch, 2: no validation classes\)$", out, re.M), out
    summary = json.loads(out[out.index("\n{") + 1:])
    rows = _rows(tmp_path / "digits")
    assert [row.get("split") for row in rows] == [None, None, "test"] and "recall_at_k" not in rows[1]
    assert rows[-1]["epoch"] == 2 and rows[-1]["chosen_by"] == "last epoch" and summary["test"] == rows[-1]
    assert summary["val_recall_at_1"] is None and summary["off_the_shelf"] is None
    assert torch.load(tmp_path / "digits" / "best.pt", weights_only=False)["epoch"] == 2


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """A folder: data set of 40 x 40 noisy photos, 10 training classes of 4 and 3 test classes of 3."""
    rng = np.random.default_rng(0)
    for part, classes, count in (("train", 10, 4), ("test", 3, 3)):
        for c in range(classes):
            folder = tmp_path / "photos" / part / f"{part}{c}"
            folder.mkdir(parents=True)
            colour = rng.integers(0, 256, 3)
            for i in range(count):
                pixels = np.clip(colour + rng.normal(0, 90, (40, 40, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return tmp_path / "photos"


def test_a_pretrained_run_ends_with_its_fine_tuned_against_the_off_the_shelf_recall(
        photos: Path, tmp_path: Path, capsys) -> None:
    torch.manual_seed(0)
    weights = tmp_path / "w.pth"  # stands in for ImageNet weights: the test backbone's, random
    torch.save(build_embedder({"backbone": "timm:test_resnet", "dim": None}).backbone.net.state_dict(), weights)
    assert main(["train", "--config", "grocery", "--output-dir", str(tmp_path), "--epochs", "2", "--pretrained",
                 str(weights), "--set", f"dataset=folder:{photos}", "split=test", "model.backbone=timm:test_resnet",
                 "model.freeze=null", "trunk_cache=0", "num_workers=0", "batches_per_epoch=2",
                 "sampler.classes_per_batch=4", "model.preprocessing.size=32"]) == 0
    out = capsys.readouterr().out
    line = re.search(r"^fine-tuned (\d\.\d{3}) vs off-the-shelf (\d\.\d{3}) Recall@1 on 2 validation classes$", out,
                     re.M)
    assert line, out
    rows = _rows(tmp_path / "grocery")
    shelf = rows[0]
    assert shelf["epoch"] == 0 and shelf["model"] == "off-the-shelf" and shelf["split"] == "val"
    assert [row["epoch"] for row in rows[1:-1]] == [1, 2] and rows[-1]["split"] == "test"
    assert f"{shelf['recall_at_k']['1']:.3f}" == line[2]
    tuned = max((row["recall_at_k"]["1"], row["map_at_r"]) for row in rows[1:-1])[0]
    assert f"{tuned:.3f}" == line[1]
    advice = ("fine-tuning did not help: export the off-the-shelf features instead with `metricsearch export "
              f"--backbone timm:test_resnet --pretrained {weights} --out off-the-shelf.onnx`")
    assert (advice in out) == (tuned <= shelf["recall_at_k"]["1"]), out
    # the off-the-shelf features are the pretrained backbone's, pooled and L2-normalised, on the validation classes
    split = load_split(f"folder:{photos}", val_classes=0.2, seed=0)
    baseline = Embedder("timm:test_resnet", dim=None, pretrained=str(weights), preprocessing={"size": 32})
    expected = evaluate_split(baseline.embed_set, replace(split, test=split.val), with_nmi=False)
    assert shelf["recall_at_k"]["1"] == pytest.approx(expected["recall_at_k"][1])
    assert shelf["map_at_r"] == pytest.approx(expected["map_at_r"], abs=1e-6)


def test_the_closing_lines_say_plainly_when_fine_tuning_did_not_help() -> None:
    config = typed_config(load_config("grocery", ["split=test"]))
    test = {"epoch": 3, "chosen_by": "validation Recall@1", "classes": 12, "recall_at_k": {1: 0.9}, "map_at_r": 0.5}
    shelf = {"classes": 4, "recall_at_k": {"1": 0.81}, "pretrained": "imagenet"}
    helped = closing_lines(config, RunState(best_recall_at_1=0.94, off_the_shelf=shelf), test)
    assert helped == ["test: R@1 0.900  MAP@R 0.500 on the 12 held-out test classes, scored once with best.pt "
                      "(epoch 3, the best validation Recall@1)",
                      "fine-tuned 0.940 vs off-the-shelf 0.810 Recall@1 on 4 validation classes"]
    worse = closing_lines(config, RunState(best_recall_at_1=0.81, off_the_shelf={**shelf, "pretrained": True}), test)
    assert worse[1:] == ["fine-tuned 0.810 vs off-the-shelf 0.810 Recall@1 on 4 validation classes",
                         "fine-tuning did not help: export the off-the-shelf features instead with `metricsearch "
                         "export --backbone efficientnet_lite0 --pretrained imagenet --out off-the-shelf.onnx`"]
