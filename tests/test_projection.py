"""`metricsearch export --dim D` (issue 90, part 1): a PCA projection appended to the exported graph, fit on the
run's training images, re-normalised, checked for parity like the rest of the graph, and recorded in the file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.decomposition import PCA

from metricsearch.evaluation import evaluate_model
from metricsearch.models import OnnxEmbedder
from metricsearch.train.projection import pca

TIMEOUT = 600


def test_pca_is_sklearns_and_whitening_gives_unit_variance() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 24)) @ rng.normal(size=(24, 24)) + rng.normal(size=24)
    mean, matrix = pca(x, 6)
    reference = PCA(6).fit(x)
    assert np.allclose(mean, reference.mean_, atol=1e-5)
    assert np.allclose(np.abs(matrix.T), np.abs(reference.components_), atol=1e-4)  # the same directions, any sign
    _, white = pca(x, 6, whiten=True)
    assert np.allclose(((x - mean) @ white).std(axis=0, ddof=1), 1, atol=1e-3)
    with pytest.raises(ValueError, match="--dim must be between 1 and 23"):
        pca(x, 24)
    with pytest.raises(ValueError, match="needs more than 6 images"):
        pca(x[:6], 6)


def test_export_dim_projects_the_run_and_keeps_its_recall(digits_run, digits_onnx: Path, tmp_path: Path) -> None:
    out = tmp_path / "digits32.onnx"
    done = subprocess.run([sys.executable, "-m", "metricsearch", "export", str(digits_run.run_dir), "--out", str(out),
                           "--dim", "32"], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["embedding_dim"] == 32 and report["max_abs_diff"] < 1e-4  # the parity check covers the projection
    small, full = OnnxEmbedder(out), OnnxEmbedder(digits_onnx)
    projection = json.loads(small.metadata["projection"])
    assert projection["dim"] == 32 and projection["from_dim"] == full.dim and projection["method"] == "pca"
    assert projection["fit_on"].startswith("the run's training images (") and not projection["whiten"]
    recall = {name: evaluate_model(model, dataset="digits", with_nmi=False)["recall_at_k"][1]
              for name, model in (("32", small), ("full", full))}
    assert recall["32"] >= recall["full"] - 0.05, recall  # a quarter of the dimensions, about the same ranking
    vectors = small.embed_arrays(np.random.default_rng(0).normal(size=(4, 1, 28, 28)).astype(np.float32))
    assert vectors.shape == (4, 32) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)


@pytest.mark.parametrize("args, message", [
    (["RUN", "--dim", "128"], "--dim must be between 1 and 127"),
    (["RUN", "--fit-images", "digits"], "--fit-images and --whiten-projection go with --dim D"),
    (["--backbone", "efficientnet_lite0", "--dim", "64"], "--dim with --backbone needs --fit-images SPEC"),
])
def test_bad_projection_requests_exit_2_in_one_line_and_write_nothing(digits_run, tmp_path: Path, args,
                                                                      message: str) -> None:
    args = [str(digits_run.run_dir) if a == "RUN" else a for a in args]
    out = tmp_path / "out.onnx"
    done = subprocess.run([sys.executable, "-m", "metricsearch", "export", *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert not out.exists()


def test_config_key_model_project_is_what_export_appends(tmp_path: Path) -> None:
    from metricsearch.train.config import load_config
    from metricsearch.train.trainer import train

    config = load_config("digits", ["model.project={dim: 16, whiten: true}", "epochs=1", "batches_per_epoch=2",
                                    f"output_dir={tmp_path}", "name=projected"])
    run_dir = train(config, progress=False).run_dir
    dims = {}
    for name, extra in (("config", []), ("none", ["--dim", "0"]), ("flag", ["--dim", "8"])):
        done = subprocess.run([sys.executable, "-m", "metricsearch", "export", str(run_dir), "--out",
                               str(tmp_path / f"{name}.onnx"), *extra], capture_output=True, text=True, timeout=TIMEOUT)
        assert done.returncode == 0, done.stderr[-3000:]
        dims[name] = json.loads(done.stdout)["embedding_dim"]
    assert dims == {"config": 16, "none": 128, "flag": 8}
    recorded = json.loads(OnnxEmbedder(tmp_path / "config.onnx").metadata["projection"])
    assert recorded["whiten"] and recorded["fit_on"].startswith("the run's training images (")
    assert "projection" not in OnnxEmbedder(tmp_path / "none.onnx").metadata
    bad = subprocess.run([sys.executable, "-m", "metricsearch", "train", "--config", "digits", "--set",
                          "model.project={dim: 128}", f"output_dir={tmp_path}"], capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert bad.returncode == 2 and "model.project.dim (128) must be below model.dim (128)" in bad.stderr, bad.stderr
