"""Every sampler, miner and weighting trains on digits from a config; bad combinations fail at start-up."""

from __future__ import annotations

import json
import math

import pytest

from metricsearch.train import sampling
from metricsearch.train.config import load_config
from metricsearch.train.trainer import train

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
    "dro_topk": ["weighting={name: dro_topk, k: 50}", "loss.name=contrastive"],
    "dro_topk_pn": ["weighting={name: dro_topk_pn, k: 50}", "loss.name=contrastive"],
    "dro_kl": ["weighting={name: dro_kl, gamma: 0.1}", "loss.name=contrastive"],
}


def config(tmp_path, name: str, overrides: list[str]) -> dict:
    """A digits config of a few steps with the given component overrides."""
    return load_config(None, [f"output_dir={tmp_path}", f"name={name}", "epochs=1", "batches_per_epoch=4",
                              "eval.nmi=false", "model.dim=32", *overrides])


def test_every_component_is_covered() -> None:
    text = " ".join(" ".join(v) for v in COMBOS.values())
    for name in sampling.SAMPLERS.names() + sampling.MINERS.names() + sampling.WEIGHTINGS.names():
        assert f"name: {name}" in text or f"name={name}" in text, name


@pytest.mark.parametrize("combo", sorted(COMBOS))
def test_combination_trains_on_digits(tmp_path, combo: str) -> None:
    result = train(config(tmp_path, combo, COMBOS[combo]), progress=False)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and math.isfinite(rows[0]["loss"])
    assert 0.2 < rows[0]["recall_at_k"]["1"] <= 1.0  # 5 test classes: chance is about 0.2


@pytest.mark.parametrize("overrides, message", [
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
