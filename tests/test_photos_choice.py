"""bench/photos.py's honest choice of the loss and the expansion rule (issue 88): the validation classes it scores are
the ones the trainer held out of the same run, never the test half's, and the choice reads only their figures."""

from __future__ import annotations

import json
import sys

import numpy as np

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
from photos import (EXPANSIONS, SHIPPED, chosen_on_validation, combine, fold_sets, nearest_photos,  # noqa: E402
                    recipe, validation_sets)

from metricsearch.data import load_split  # noqa: E402
from metricsearch.evaluation.distances import normalized  # noqa: E402


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


def test_the_choice_is_the_best_catalogue_accuracy_over_families_and_rules_and_the_first_on_a_tie() -> None:
    hits = {m: np.array([1.0, 0.0]) for m in ("recall_at_1", "catalogue_at_1", "catalogue_expanded_at_1")}
    better = {**hits, "catalogue_expanded_at_1": np.array([1.0, 1.0])}
    rules = list(EXPANSIONS)
    assert rules[0] == SHIPPED
    assert chosen_on_validation({"ms": dict.fromkeys(rules, hits),
                                 "proxy_anchor": {**dict.fromkeys(rules, hits), "none": better}})[:2] == (
        "proxy_anchor", "none")
    same = {"ms": dict.fromkeys(rules, hits), "proxy_anchor": dict.fromkeys(rules, hits)}
    family, rule, line = chosen_on_validation(same)
    assert (family, rule) == ("ms", SHIPPED) and f"proxy_anchor: {SHIPPED} 0.500" in line and "(R@1 0.500)" in line


def test_each_expansion_rule_moves_entries_toward_the_pool_except_none() -> None:
    rng = np.random.default_rng(0)
    catalogue = normalized(rng.normal(size=(4, 8)))
    pool = normalized(catalogue[rng.integers(0, 4, 40)] + 0.3 * rng.normal(size=(40, 8)))
    for name, rule in EXPANSIONS.items():
        entries = rule(catalogue, pool)
        assert entries.shape == catalogue.shape and np.allclose(np.linalg.norm(entries, axis=1), 1), name
        assert np.allclose(entries, catalogue) == (name == "none"), name
    near = nearest_photos(catalogue, pool, k=3)
    order = np.argsort(-(catalogue @ pool.T), axis=1)[:, :3]
    assert np.allclose(near, normalized(catalogue + pool[order].mean(1)))


def test_combining_runs_of_other_seeds_averages_each_querys_scores(tmp_path) -> None:
    def saved(path, hits: list[float], fold: str = "half1"):
        scores = {m: hits for m in ("recall_at_1", "map_at_r", "catalogue_at_1", "catalogue_expanded_at_1")}
        row = {"what": "ms", "train": {}, "scores": {fold: scores}}
        path.write_text(json.dumps({"speed": None, "raw": {"ms": row}}))
        return path

    rows, _ = combine([saved(tmp_path / "a.json", [1, 0, 1]), saved(tmp_path / "b.json", [1, 1, 0]),
                       saved(tmp_path / "c.json", [0, 1], "half2")])
    (row,) = rows
    assert np.allclose(row["scores"]["half1"]["recall_at_1"], [1, 0.5, 0.5])  # two seeds of a fold: averaged
    assert np.allclose(row["scores"]["half2"]["catalogue_at_1"], [0, 1])  # one run of the other fold: as it was
    assert "half1 0.667, 0.667" in row["what"] and "half2" not in row["what"]
