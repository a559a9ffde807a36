"""How a run is scored: each evaluated epoch on the validation classes, the pretrained backbone's off-the-shelf
record, the test classes once with best.pt, and the lines a run prints."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from metricsearch.data import DataSplit, ImageSet
from metricsearch.evaluation import evaluate_split
from metricsearch.models.torch_embedder import Embedder
from metricsearch.train.config import TrainConfig
from metricsearch.train.run_dir import RunState
from metricsearch.train.setup import Setup


def evaluate(model: Embedder, split: DataSplit, config: TrainConfig, validation: bool) -> dict[str, Any]:
    """Recall@K, NMI and MAP@R of `model` on the split's validation classes (every image against the others), or on
    its test classes (query vs gallery where given, and the one-shot episodes of `eval.one_shot_ways`), with the
    part's name and number of classes."""
    ev = config.eval

    def embed(images: ImageSet) -> np.ndarray:
        return model.embed_set(images, batch_size=ev.batch_size)

    if validation:
        part = replace(split, test=split.val, query=None, gallery=None)
        return {"split": "val", "classes": len(split.val.class_names),
                **evaluate_split(embed, part, ev.recall_k, ev.nmi)}
    return {"split": "test", "classes": len(split.test.class_names),
            **evaluate_split(embed, split, ev.recall_k, ev.nmi, ev.one_shot_ways)}


def score_off_the_shelf(setup: Setup) -> dict[str, Any]:
    """The off-the-shelf record: the validation classes' scores of the run's backbone with its pretrained weights,
    untrained and without a head (its pooled, L2-normalised features, as `metricsearch export --backbone` writes
    them), at the run's preprocessing."""
    model = setup.config.model
    baseline = Embedder(model.backbone, dim=None, normalize=True, pretrained=model.pretrained,
                        preprocessing=model.preprocessing, backbone_params=model.backbone_params).to(setup.device)
    return {"epoch": 0, "model": "off-the-shelf", "backbone": model.backbone, "pretrained": model.pretrained,
            **evaluate(baseline, setup.split, setup.config, validation=True)}


def score_test(setup: Setup, state: RunState, run_dir: Path) -> dict[str, Any]:
    """The run's final record: the held-out test classes scored once, with best.pt's weights (loaded into the
    setup's model where it is not the last epoch)."""
    best = torch.load(run_dir / "best.pt", map_location="cpu", weights_only=False)
    if best["epoch"] != len(state.history):
        setup.model.load_state_dict(best["model"])
    chosen = "validation Recall@1" if setup.split.val is not None else "last epoch"
    return {"epoch": best["epoch"], "checkpoint": "best.pt", "chosen_by": chosen,
            **evaluate(setup.model, setup.split, setup.config, validation=False)}


def selection_score(row: dict[str, Any]) -> tuple[float, float] | None:
    """What best.pt maximises, of an epoch evaluated on the validation classes: its Recall@1, then (between equals,
    as when a few classes saturate Recall@1) its MAP@R; None for an epoch not evaluated."""
    if "recall_at_k" not in row:
        return None
    return recall_at_1(row), float(row["map_at_r"])


def recall_at_1(record: dict[str, Any]) -> float:
    """The Recall@1 of an evaluation record (its keys are numbers, or text once read back from JSON)."""
    recall = record["recall_at_k"]
    return float(recall[1] if 1 in recall else recall["1"])


def off_the_shelf_line(config: TrainConfig, shelf: dict[str, Any]) -> str:
    """What a run says of its off-the-shelf record before its first epoch."""
    return (f"off-the-shelf {config.model.backbone}: R@1 {recall_at_1(shelf):.3f} on {shelf['classes']} validation "
            "classes, before the first epoch")


def epoch_line(row: dict[str, Any], epoch: int, epochs: int) -> str:
    """What a run says after each epoch: its loss and speed, and its validation scores where it was evaluated."""
    text = f"epoch {epoch + 1}/{epochs}  loss {row['loss']:.4f}  {row['images_per_s']:.0f} img/s"
    if "recall_at_k" in row:
        recalls = "  ".join(f"R@{k} {v:.3f}" for k, v in row["recall_at_k"].items())
        nmi = f"  NMI {row['nmi']:.3f}" if row.get("nmi") is not None else ""
        text += f"  |  validation {recalls}{nmi}  MAP@R {row['map_at_r']:.3f}"
    return text


def closing_lines(config: TrainConfig, state: RunState, test: dict[str, Any]) -> list[str]:
    """What a run ends by saying: its test score and the checkpoint that made it; where the backbone was pretrained
    and validated, the fine-tuned against the off-the-shelf Recall@1 on the validation classes, and whether that
    helped."""
    chosen = (f"epoch {test['epoch']}, the best validation Recall@1" if test["chosen_by"] != "last epoch"
              else f"the last epoch, {test['epoch']}: no validation classes")
    lines = [f"test: R@1 {recall_at_1(test):.3f}  MAP@R {test['map_at_r']:.3f} on the {test['classes']} held-out "
             f"test classes, scored once with best.pt ({chosen})"]
    shelf = state.off_the_shelf
    if shelf is not None:
        tuned, base = state.best_recall_at_1, recall_at_1(shelf)
        lines.append(f"fine-tuned {tuned:.3f} vs off-the-shelf {base:.3f} Recall@1 on {shelf['classes']} validation "
                     "classes")
        if tuned <= base:
            weights = "imagenet" if shelf["pretrained"] is True else shelf["pretrained"]
            lines.append("fine-tuning did not help: export the off-the-shelf features instead with `metricsearch "
                         f"export --backbone {config.model.backbone} --pretrained {weights} --out off-the-shelf.onnx`")
    return lines
