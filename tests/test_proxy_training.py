"""The proxy losses through the real trainer: every packaged config starts with one, the proxies learn at their own
rate, are checkpointed and resumed exactly, stay out of the exported ONNX graph, and plain random batches train."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from metricsearch.app.cli import main
from metricsearch.train.config import load_config, packaged_configs
from metricsearch.train.trainer import train
from test_loss_training import BASE, untrained_recall_at_1  # noqa: F401  # the fixture, shared

#: every packaged recipe, shrunk to one step on a few tiny photos without ImageNet weights: the recipes' own
#: backbones, heads (grocery's none: 1280-d proxies), frozen trunks and their caches, amp, channels-last, and
#: classes made of transformed copies (omniglot's) meet a proxy loss; the slow post-steps (whitening, distillation)
#: do not touch the loss and are left out
SHRINK = ["--quiet", "--epochs", "1", "--pretrained", "false", "--set", "loss.name=proxy_anchor", "split=all",
          "batches_per_epoch=1", "sampler.classes_per_batch=4", "model.preprocessing.size=32", "num_workers=0",
          "distill.epochs=0", "model.whiten=0.0"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder: data set of random 40 x 40 photos, 4 training classes of 4 and 2 test classes of 2."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for part, classes, count in (("train", 4, 4), ("test", 2, 2)):
        for c in range(classes):
            folder = root / part / f"{part}{c}"
            folder.mkdir(parents=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return root


@pytest.mark.parametrize("config", packaged_configs())
def test_every_packaged_config_trains_a_step_with_proxy_anchor(config: str, photos: Path, tmp_path: Path,
                                                               capsys) -> None:
    assert main(["train", "--config", config, *SHRINK, f"output_dir={tmp_path}", f"dataset=folder:{photos}"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["epochs"] == 1 and np.isfinite(summary["last"]["loss"])
    state = torch.load(Path(summary["run_dir"]) / "last.pt", weights_only=False)
    recipe = load_config(config)
    classes = 6 * (1 + len(recipe["augment_classes"]))  # omniglot's copies are classes of their own
    assert state["loss"]["proxies"].shape == (classes, recipe["model"]["dim"] or 1280)  # grocery: no head


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One digits run with Proxy-Anchor and a distillation epoch, whole, and again paused after its first epoch and
    resumed."""
    out = tmp_path_factory.mktemp("proxy_runs")
    overrides = [f"output_dir={out}", "loss.name=proxy_anchor", "epochs=1", "distill.epochs=1", "batches_per_epoch=3",
                 "model.dim=8", "split=all"]
    whole = train(load_config(None, [*overrides, "name=whole"]), progress=False).run_dir
    paused = load_config(None, [*overrides, "name=paused"])
    train(paused, stop_after_epoch=1, progress=False)
    first = torch.load(out / "paused" / "last.pt", weights_only=False)
    resumed = train(paused, resume=True, progress=False).run_dir
    assert not torch.equal(first["loss"]["proxies"], torch.load(resumed / "last.pt", weights_only=False)["loss"]
                           ["proxies"]), "the proxies did not learn in the distillation epoch"
    return whole, resumed


def test_proxies_learn_at_their_own_rate_and_resume_exactly(runs: tuple[Path, Path]) -> None:
    whole, resumed = (torch.load(run / "last.pt", weights_only=False) for run in runs)
    assert torch.equal(whole["loss"]["proxies"], resumed["loss"]["proxies"])
    assert all(torch.equal(whole["model"][k], resumed["model"][k]) for k in whole["model"])
    groups = whole["optimizer"]["param_groups"]  # the distillation's fresh optimizer: every group at distill.lr
    assert [g["initial_lr"] for g in groups] == pytest.approx([0.0002, 0.0002, 0.02])
    assert groups[-1]["lr"] == pytest.approx(100 * groups[0]["lr"])  # the schedule scales them alike
    assert len(groups[-1]["params"]) == 1 and whole["loss"]["proxies"].shape == (10, 8)


def test_the_exported_graph_holds_no_proxy(runs: tuple[Path, Path], tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    from metricsearch.train import export_onnx

    run = runs[0]
    proxies = torch.load(run / "last.pt", weights_only=False)["loss"]["proxies"].numpy()
    report = export_onnx(run, tmp_path / "model.onnx")
    arrays = [numpy_helper.to_array(init) for init in onnx.load(str(report.path)).graph.initializer]
    assert arrays and report.embedding_dim == proxies.shape[1]
    assert not any(a.shape == proxies.shape or (a.size == proxies.size and np.allclose(a.ravel(), proxies.ravel()))
                   for a in arrays)


def test_plain_random_batches_train_a_proxy_loss(tmp_path: Path, untrained_recall_at_1: float) -> None:  # noqa: F811
    config = load_config(None, [f"output_dir={tmp_path}", *BASE, "loss.name=proxy_anchor",
                                "sampler={name: random, batch_size: 80}"])
    result = train(config, progress=False)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["loss"] < rows[0]["loss"]
    assert rows[-1]["recall_at_k"]["1"] > untrained_recall_at_1


def test_an_ensemble_cannot_share_proxies() -> None:
    with pytest.raises(ValueError, match="model.members: 1"):
        load_config(None, ["loss.name=soft_triple", "model.members=2"])
