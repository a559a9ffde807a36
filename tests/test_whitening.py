"""Within-class whitening of a trained embedding (`model.whiten`): its matrix against a direct reference, the model
in torch and ONNX, and the trainer fitting it on the original training images."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from scipy.linalg import fractional_matrix_power

from metricsearch.app.cli import main
from metricsearch.data import load_split, original_images, with_transformed_classes
from metricsearch.models.onnx_embedder import OnnxEmbedder
from metricsearch.models.torch_embedder import build_embedder, load_embedder
from metricsearch.train.config import typed_config
from metricsearch.train.export import export_onnx
from metricsearch.train.trainer import train
from metricsearch.train.whitening import whitened, whitening_matrix
from test_pipeline import quick_config


def reference_matrix(x: np.ndarray, labels: np.ndarray, power: float) -> np.ndarray:
    """The formula directly: class by class, the scatter of the embeddings around their class mean, to -power."""
    scatter = np.zeros((x.shape[1], x.shape[1]))
    for c in np.unique(labels):
        d = x[labels == c] - x[labels == c].mean(axis=0)
        scatter += d.T @ d
    return np.real(fractional_matrix_power(scatter / len(x), -power))


@pytest.mark.parametrize("power", [0.25, 0.5, 1.0])
def test_the_matrix_is_the_within_class_scatter_to_the_minus_power(power) -> None:
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(12), 5)
    x = rng.normal(size=(60, 6)) * [3, 1, 1, 0.5, 0.2, 1] + rng.normal(size=(12, 6))[labels] * 2
    matrix = whitening_matrix(x, labels, power)
    np.testing.assert_allclose(matrix, reference_matrix(x, labels, power), rtol=1e-8, atol=1e-10)
    if power == 0.5:  # fully whitened: the within-class scatter becomes the identity
        means = np.stack([x[labels == c].mean(0) for c in range(12)])
        d = (x - means[labels]) @ matrix
        np.testing.assert_allclose(d.T @ d / len(x), np.eye(6), atol=1e-8)


def test_a_whitened_model_whitens_in_eval_mode_only_in_torch_and_onnx(tmp_path) -> None:
    torch.manual_seed(0)
    model = build_embedder({"dim": 8, "whiten": 0.25, "backbone_params": {"width": 8},
                            "tta_shifts": [[0, 0], [2, 0]]})
    x = torch.randn(5, 1, 28, 28)
    with torch.no_grad():
        plain = model.eval()(x)
        matrix = torch.randn(8, 8) / 3 + torch.eye(8)
        model.set_whitening(matrix)
        torch.testing.assert_close(model(x), F.normalize(plain @ matrix, dim=1))
        model.train()
        trained = model(x)
        model.set_whitening(torch.eye(8))
        torch.testing.assert_close(model(x), trained)  # training never sees the whitening
        model.set_whitening(matrix)
        model.eval()
        expected = model(x)
    assert model.config["whiten"] == 0.25 and "whiten" not in build_embedder({"dim": 8}).config
    torch.save(model.checkpoint(), tmp_path / "w.pt")
    with torch.no_grad():
        torch.testing.assert_close(load_embedder(tmp_path / "w.pt")(x), expected)
    export_onnx(model, tmp_path / "w.onnx", x.numpy())
    onnx_model = OnnxEmbedder(tmp_path / "w.onnx", device="cpu")
    assert np.abs(onnx_model.embed_arrays(x.numpy()) - expected.numpy()).max() <= 1e-4
    assert json.loads(onnx_model.metadata["model_config"])["whiten"] == 0.25
    with pytest.raises(ValueError, match=r"must be \(8, 8\)"):
        model.set_whitening(torch.eye(4))
    with pytest.raises(ValueError, match="whiten > 0"):
        build_embedder({"dim": 8}).set_whitening(torch.eye(8))


def test_training_fits_the_whitening_on_the_original_training_images(tmp_path) -> None:
    config = quick_config(tmp_path, "model.whiten=0.25", "augment_classes=[rot90]", "eval.every=1", "val_classes=0.4")
    run = train(config, progress=False).run_dir
    model = load_embedder(run / "last.pt")
    settings = typed_config(config)
    split = load_split(settings.dataset, split_classes=settings.split_classes, split=settings.split,
                       val_classes=settings.val_classes, seed=settings.seed)  # 2 of the 5 digits validate
    images = original_images(with_transformed_classes(split.train, ["rot90"]))
    assert np.array_equal(images.labels, split.train.labels) and list(images.items) == list(split.train.items)
    fitted = model.whitening.numpy().copy()
    assert np.abs(fitted - np.eye(model.dim)).max() > 0.1
    again = whitened(model, images, 0.25)
    np.testing.assert_allclose(again.whitening.numpy(), fitted, rtol=1e-4, atol=1e-4)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all("recall_at_k" in row for row in rows)  # evaluated whitened, every epoch (validation), then the test


@pytest.mark.parametrize("value", ["-0.1", "1.5", "yes"])
def test_a_whitening_power_out_of_range_exits_2_with_one_line(tmp_path, capsys, value) -> None:
    args = ["train", "--output-dir", str(tmp_path), "--set", "epochs=1", "batches_per_epoch=1", f"model.whiten={value}"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.whiten" in err[0], err


@pytest.fixture(scope="module")
def viewed_run(tmp_path_factory):
    """A whitened digits run with two shifts, a rotation and a symmetric copy as its test-time views."""
    config = quick_config(tmp_path_factory.mktemp("viewed"), "epochs=1", "model.whiten=0.25",
                          "model.tta_shifts=[[0, 0], [2, 0]]", "model.tta_rotations=[10]",
                          "model.tta_symmetries=[transpose]")
    return train(config, progress=False).run_dir


@pytest.mark.parametrize("changes, refit", [
    (["model.tta_rotations=[]", "model.tta_symmetries=[]"], True),  # one pass: the whitening fit again
    (["model.tta_symmetries=[]"], False),  # the copies share the matrix: kept
])
def test_an_export_with_other_views_has_them_and_the_whitening_they_need(viewed_run, tmp_path, changes, refit):
    out = tmp_path / "fast.onnx"
    assert main(["export", str(viewed_run), "--out", str(out), "--set", *changes]) == 0
    onnx_model = OnnxEmbedder(out, device="cpu")
    config = json.loads(onnx_model.metadata["model_config"])
    reference = load_embedder(viewed_run / "last.pt")
    saved = reference.whitening.clone()
    rotations = [] if refit else [10.0]
    assert config.get("tta_rotations", []) == rotations and "tta_symmetries" not in config
    assert config["tta_shifts"] == [[0, 0], [2, 0]] and config["whiten"] == 0.25
    reference.set_views([[0, 0], [2, 0]], rotations, [])
    settings = typed_config(yaml.safe_load((viewed_run / "config.yaml").read_text()))
    split = load_split(settings.dataset, split_classes=settings.split_classes, split=settings.split)
    if refit:  # the matrix of the new views, fit as training fits it
        reference = whitened(reference, split.train, 0.25)
        assert (reference.whitening - saved).abs().max() > 1e-3
    x = np.stack([reference.preprocessing(split.test.load(i)) for i in range(12)])
    expected = reference.eval().embed_arrays(x)
    assert np.abs(onnx_model.embed_arrays(x) - expected).max() <= 1e-4


@pytest.mark.parametrize("changes, named", [
    (["model.dim=8"], "model.dim"), (["seed=3"], "seed"), (["model.tta_shifts=[[1]]"], "model.tta_shifts"),
    (["model.tta_symmetries=[spin]"], "model.tta_symmetries"), (["model.tta_rotations=left"], "model.tta_rotations"),
])
def test_an_export_with_a_bad_view_key_exits_2_naming_it(viewed_run, tmp_path, capsys, changes, named) -> None:
    out = tmp_path / "bad.onnx"
    assert main(["export", str(viewed_run), "--out", str(out), "--set", *changes]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err
    assert not out.exists()


def test_off_the_shelf_features_take_no_views_exit_2(tmp_path, capsys) -> None:
    out = tmp_path / "lite.onnx"
    args = ["export", "--backbone", "efficientnet_lite0", "--out", str(out), "--set", "model.tta_rotations=[]"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--set" in err[0] and "--backbone" in err[0], err
    assert not out.exists()


def test_a_model_in_memory_keeps_its_views_and_cannot_refit_without_its_run(tmp_path) -> None:
    torch.manual_seed(0)
    model = build_embedder({"dim": 8, "whiten": 0.25, "backbone_params": {"width": 8},
                            "tta_shifts": [[0, 0], [2, 0]], "tta_symmetries": ["transpose"]})
    x = torch.randn(4, 1, 28, 28).numpy()
    export_onnx(model, tmp_path / "one.onnx", x, views={"tta_symmetries": []})
    assert model.tta_symmetries == ["transpose"] and model.config["tta_symmetries"] == ["transpose"]
    expected = model.eval()
    expected.set_views([[0, 0], [2, 0]], [], [])
    assert np.abs(OnnxEmbedder(tmp_path / "one.onnx", device="cpu").embed_arrays(x)
                  - expected.embed_arrays(x)).max() <= 1e-4
    with pytest.raises(ValueError, match="export the run directory"):
        export_onnx(model, tmp_path / "two.onnx", x, views={"tta_shifts": [[0, 0]]})
    assert not (tmp_path / "two.onnx").exists()
