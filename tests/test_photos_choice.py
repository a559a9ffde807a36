"""bench/photos.py's honest choice of the loss (issue 88): the validation classes it scores are the ones the trainer
held out of the same run, never the test half's, and the choice reads only their figures."""

from __future__ import annotations

import sys

import numpy as np

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
from photos import chosen_on_validation, fold_sets, recipe, validation_sets  # noqa: E402

from metricsearch.data import load_split  # noqa: E402


def test_validation_sets_are_the_runs_held_out_training_classes_and_never_the_test_half(grocery_dir, tmp_path) -> None:
    config = recipe("ms", "half2", grocery_dir, tmp_path, [], val=0.25)
    run = load_split(config["dataset"], split=config["split"], val_classes=config["val_classes"], seed=config["seed"])
    sets = validation_sets(grocery_dir, "half2", 0.25, config["seed"])
    test = set(fold_sets(grocery_dir, "half2")["query"].class_names)
    for name, images in sets.items():
        held = {images.class_names[k] for k in images.labels}
        assert held == set(run.val.class_names), name  # the trainer's validation classes, each with images
        assert not held & test and not held & set(run.train.class_names), name
    assert len(run.val.class_names) == round(0.25 * len(set(run.val.class_names) | set(run.train.class_names)))


def test_the_choice_is_the_best_expanded_catalogue_accuracy_on_validation_and_the_first_on_a_tie() -> None:
    hits = {m: np.array([1.0, 0.0]) for m in ("recall_at_1", "catalogue_at_1", "catalogue_expanded_at_1")}
    better = {**hits, "catalogue_expanded_at_1": np.array([1.0, 1.0]), "catalogue_at_1": np.array([0.0, 0.0])}
    assert chosen_on_validation({"ms": hits, "proxy_anchor": better})[0] == "proxy_anchor"
    best, line = chosen_on_validation({"ms": hits, "proxy_anchor": hits})
    assert best == "ms" and "proxy_anchor 0.500 (0.500 plain, R@1 0.500)" in line
