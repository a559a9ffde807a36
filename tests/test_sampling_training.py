"""Every sampler, miner and weighting trains on digits from a config; bad combinations fail at start-up."""

from __future__ import annotations

import json
import math

import pytest

from metricsearch.evaluation import evaluate_model
from metricsearch.models.torch_embedder import build_embedder
from metricsearch.train import miners, samplers, weightings
from metricsearch.train.config import load_config
from metricsearch.train.trainer import seed_everything, train

#: as test_loss_training.BASE: 2 epochs x 8 batches in 4 dimensions, where the untrained model scores ~0.47
BASE = ["epochs=2", "batches_per_epoch=8", "eval.nmi=false", "model.dim=4", "optimizer.lr=0.001",
        "optimizer.head_lr=0.001"]

# (overrides) per combination: each registered sampler, miner and weighting appears at least once
COMBOS = {
    "group+ms": ["sampler={name: group, classes_per_batch: 5, images_per_class: 8}"],
    "p_random+contrastive": ["sampler={name: p_random, p: 0.5, pairs_per_batch: 24}", "loss.name=contrastive"],
    "npair_hard_class+npair": ["sampler={name: npair_hard_class, classes_per_batch: 5, images_per_class: 2}",
                               "loss.name=npair"],
    "semihard+triplet": ["miner.name=semihard", "loss.name=triplet"],
    "hard+triplet_l2": ["miner.name=hard", "loss.name=triplet_l2"],
    "batch_hard+triplet": ["miner.name=batch_hard", "loss.name=triplet"],
    "distance_weighted+triplet_l2": ["miner.name=distance_weighted", "loss.name=triplet_l2"],
    "distance_weighted_pairs+margin": ["miner={name: distance_weighted, produces: pairs}", "loss.name=margin"],
    "ms_miner+contrastive": ["miner.name=ms", "loss.name=contrastive"],
    "random+contrastive": ["miner.name=random", "loss.name=contrastive"],
    "importance+group+balanced": ["weighting.name=importance", "loss.name=balanced_contrastive"],
    "importance+p_random": ["sampler={name: p_random, p: 0.1, pairs_per_batch: 24}",
                            "weighting.name=importance", "loss.name=contrastive"],
    # k = 400 of the batch's 6,320 pairs: with k = 50 sixteen steps move too few pairs to beat the untrained model
    "dro_topk": ["weighting={name: dro_topk, k: 400}", "loss.name=contrastive"],
    "dro_topk_pn": ["weighting={name: dro_topk_pn, k: 400}", "loss.name=contrastive"],
    "dro_kl": ["weighting={name: dro_kl, gamma: 0.1}", "loss.name=contrastive"],
}


#: super-class batches need the images' groups: Omniglot's alphabets (the embedded minimal sets), not digits
SUPER_CLASS = ["dataset=omniglot", "split=test",
               "sampler={name: super_class, classes_per_batch: 8, images_per_class: 4, super_classes_per_batch: 1}"]


def config(tmp_path, name: str, overrides: list[str]) -> dict:
    """A digits config of 2 x 8 steps with the given component overrides, in 4 dimensions: in 32 or more even
    the untrained network's features reach Recall@1 ~0.96 on the held-out digits (test_loss_training.py)."""
    return load_config(None, [f"output_dir={tmp_path}", f"name={name}", *BASE, *overrides])


@pytest.fixture(scope="module")
def untrained_recall_at_1(tmp_path_factory: pytest.TempPathFactory) -> float:
    """Recall@1 on the digits test classes of the model the trainer starts from (same seed)."""
    base = config(tmp_path_factory.mktemp("untrained"), "untrained", [])
    seed_everything(base["seed"])
    return float(evaluate_model(build_embedder(base["model"]), dataset="digits", with_nmi=False)["recall_at_k"][1])


def test_every_component_is_covered() -> None:
    text = " ".join(" ".join(v) for v in [*COMBOS.values(), SUPER_CLASS])
    for name in samplers.SAMPLERS.names() + miners.MINERS.names() + weightings.WEIGHTINGS.names():
        assert f"name: {name}" in text or f"name={name}" in text, name


@pytest.mark.parametrize("combo", sorted(COMBOS))
def test_combination_trains_on_digits(tmp_path, combo: str, untrained_recall_at_1: float) -> None:
    result = train(config(tmp_path, combo, COMBOS[combo]), progress=False)
    *rows, test = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(math.isfinite(row["loss"]) for row in rows)
    recall = test["recall_at_k"]["1"]  # the test classes, scored once with the last epoch
    assert recall > untrained_recall_at_1, f"{combo}: Recall@1 {recall:.4f}, untrained {untrained_recall_at_1:.4f}"


def test_super_class_batches_train_each_on_one_alphabet(tmp_path) -> None:
    from metricsearch.data import load_split
    from metricsearch.train.config import typed_config
    from metricsearch.train.trainer import build_components

    cfg = config(tmp_path, "super", SUPER_CLASS)
    train_set = load_split("omniglot", split="test").train
    sampler = build_components(typed_config(cfg), train_set)[1]
    alphabets = [set(train_set.groups[batch]) for batch in sampler]
    assert len(alphabets) == len(sampler) and all(len(a) == 1 for a in alphabets)
    result = train(cfg, progress=False)
    *rows, test = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(math.isfinite(row["loss"]) for row in rows) and test["split"] == "test"
    assert rows[-1]["loss"] < rows[0]["loss"]


@pytest.mark.parametrize("overrides, message", [
    (["sampler={name: super_class, classes_per_batch: 5}"], "needs the group of each image"),
    (["miner.name=semihard", "loss.name=contrastive"], "triplet"),
    (["miner.name=ms", "loss.name=triplet"], "pair"),
    (["weighting.name=importance", "loss.name=ms"], "weighting"),
    (["sampler={name: p_random}", "loss.name=triplet"], "fixes the pairs"),
    (["weighting.name=importance", "loss.name=contrastive",
      "sampler={name: npair_hard_class, classes_per_batch: 5}"], "importance"),
])
def test_incompatible_combinations_fail_before_training(tmp_path, overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        train(config(tmp_path, "bad", overrides), progress=False)
    assert not (tmp_path / "bad").exists()
