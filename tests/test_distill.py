"""Distillation toward the test-time views (config `distill`): the distance against a loop reference with a gradient
check, the targets, and the trainer (exact resume, added to a finished run, what it changes); its config errors are
in tests/test_config.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from metricsearch.data import load_split
from metricsearch.models.torch_embedder import build_embedder, load_embedder
from metricsearch.train.distill import TARGETS_FILE, distance_to_targets, view_targets
from metricsearch.train.trainer import train
from test_pipeline import quick_config

#: a small model with test-time shifts and a rotation, whitened (what a distillation starts from), evaluated last
VIEWS = ["model.tta_shifts=[[0, 0], [2, 2]]", "model.tta_rotations=[15]", "model.whiten=0.25", "eval.every=10"]


def ref_distance(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The formula row by row: 1 - x.t / (|x| |t|), averaged."""
    terms = [1 - torch.dot(x[i], t[i]) / (x[i].norm() * t[i].norm()) for i in range(len(x))]
    return torch.stack(terms).mean()


def test_the_distance_matches_a_loop_reference_and_passes_gradcheck() -> None:
    torch.manual_seed(0)
    x = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    t = torch.randn(7, 5, dtype=torch.float64)
    fast, slow = distance_to_targets(x, t), ref_distance(x, t)
    torch.testing.assert_close(fast, slow)
    torch.testing.assert_close(torch.autograd.grad(fast, x)[0], torch.autograd.grad(slow, x)[0])
    assert torch.autograd.gradcheck(lambda e: distance_to_targets(e, t), (x,))
    assert float(distance_to_targets(t * 3, t)) == pytest.approx(0, abs=1e-12)  # scale does not count


def test_the_targets_are_the_views_mean_unwhitened_and_the_model_is_left_as_it_was() -> None:
    torch.manual_seed(0)
    config = {"dim": 8, "backbone_params": {"width": 8}, "tta_shifts": [[0, 0], [2, 2]], "tta_rotations": [15],
              "tta_symmetries": ["transpose"], "whiten": 0.25}
    model = build_embedder(config).eval()
    matrix = torch.eye(8) + torch.randn(8, 8) / 3
    model.set_whitening(matrix)
    images = load_split("digits").train.subset(np.arange(40))
    targets = view_targets(model, images, batch_size=16)
    plain = build_embedder({k: v for k, v in config.items() if k not in ("whiten", "tta_symmetries")}).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k != "whitening"})
    expected = F.normalize(torch.from_numpy(plain.embed_set(images)), dim=1)
    torch.testing.assert_close(targets, expected, rtol=1e-4, atol=1e-5)
    assert targets.shape == (40, 8)
    assert torch.equal(model.whitening, matrix) and model.tta_symmetries == ["transpose"]
    assert model.dim == 16 and model.config == build_embedder(config).config
    views = ([[0, 0], [1, -1], [-2, 0]], [-10.0, 10.0])  # other views than the test's (distill.shifts, rotations)
    plain.set_views(*views)
    wider = view_targets(model, images, batch_size=16, views=views)
    torch.testing.assert_close(wider, F.normalize(torch.from_numpy(plain.embed_set(images)), dim=1),
                               rtol=1e-4, atol=1e-5)
    assert not torch.allclose(wider, targets, atol=1e-3) and model.config == build_embedder(config).config


def test_the_trainer_takes_the_targets_with_the_distill_sections_views(tmp_path) -> None:
    finished = train(quick_config(tmp_path, *VIEWS), progress=False)  # its own epochs; the distillation added next
    model = load_embedder(finished.run_dir / "last.pt")
    views = "distill={epochs: 1, shifts: [[0, 0], [3, 0], [0, -3]], rotations: [-20, 20]}"
    expected = view_targets(model, load_split("digits").train, views=([[0, 0], [3, 0], [0, -3]], [-20, 20]))
    result = train(quick_config(tmp_path, *VIEWS, views), resume=True, progress=False)
    torch.testing.assert_close(torch.load(result.run_dir / TARGETS_FILE, weights_only=True), expected,
                               rtol=1e-4, atol=1e-5)


def test_a_distillation_resumes_exactly_and_equals_one_added_to_a_finished_run(tmp_path) -> None:
    distill = "distill={epochs: 2, weight: 10.0, lr: 0.0005}"
    full = train(quick_config(tmp_path, "name=full", *VIEWS, distill), progress=False)
    assert full.epochs == 4 and (full.run_dir / TARGETS_FILE).is_file()
    train(quick_config(tmp_path, "name=paused", *VIEWS, distill), progress=False, stop_after_epoch=3)
    paused = train(quick_config(tmp_path, "name=paused", *VIEWS, distill), resume=True, progress=False)
    train(quick_config(tmp_path, "name=late", *VIEWS), progress=False)  # its own 2 epochs, no distillation
    late = train(quick_config(tmp_path, "name=late", *VIEWS, distill), resume=True, progress=False)
    a, b, c = (torch.load(r.run_dir / "last.pt", weights_only=False) for r in (full, paused, late))
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]) and torch.equal(value, c["model"][key]), key
    assert a["distill_after"] == 2 and [row.get("phase") for row in a["history"]] == [None, None, "distill", "distill"]
    assert [row["lr"] for row in a["history"][2:]] == [pytest.approx(0.0005 * 0.505), pytest.approx(0.0005 * 0.01)]
    with pytest.raises(ValueError, match="set epochs: 2"):  # own epochs cannot be added once it distils
        train(quick_config(tmp_path, "name=full", "epochs=3", *VIEWS, distill), resume=True, progress=False)


def test_distilling_brings_the_plain_embeddings_toward_the_targets(tmp_path) -> None:
    def distance(run, weight: float) -> float:
        result = train(quick_config(tmp_path, f"name={run}", *VIEWS, f"distill={{epochs: 2, weight: {weight}}}"),
                       progress=False)
        targets = torch.load(result.run_dir / TARGETS_FILE, weights_only=True)
        model = load_embedder(result.run_dir / "last.pt")
        model.set_views([], [])  # one plain pass, as the training steps embed
        model.set_whitening(torch.eye(model.part_dim))
        return float(distance_to_targets(torch.from_numpy(model.embed_set(load_split("digits").train)), targets))

    pulled, free = distance("pulled", 10.0), distance("free", 0.0)
    assert pulled < 0.5 * free, (pulled, free)


@pytest.mark.parametrize("extra", [["model.members=2"], ["memory={size: 32, start_epoch: 0}"]])
def test_a_distillation_trains_beside_members_and_a_cross_batch_memory(tmp_path, extra) -> None:
    result = train(quick_config(tmp_path, *VIEWS, "distill={epochs: 1}", *extra), progress=False)
    rows = result.run_dir / "metrics.jsonl"
    phases = [json.loads(line).get("phase") for line in rows.read_text().splitlines()]
    assert phases == [None, None, "distill", None] and np.isfinite(result.last_metrics["loss"])  # then the test
    targets = torch.load(result.run_dir / TARGETS_FILE, weights_only=True)
    assert targets.shape[1] == load_embedder(result.run_dir / "last.pt").part_dim
