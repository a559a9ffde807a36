"""Test-time symmetric copies (`model.tta_symmetries`): the tensor transposes against PIL's, the embedding side by
side in torch and in the exported graph, the whitening fit on the images' own embeddings."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from metricsearch.data.base import CLASS_TRANSFORMS
from metricsearch.models.onnx_embedder import OnnxEmbedder
from metricsearch.models.torch_embedder import SYMMETRIES, build_embedder, load_embedder
from metricsearch.train.export import export_onnx
from metricsearch.train.whitening import fit_whitening

MODEL = {"dim": 8, "backbone_params": {"width": 8, "pool": "max"}, "tta_shifts": [[0, 0], [2, 0], [0, -2]],
         "tta_rotations": [15], "whiten": 0.25}


def test_each_symmetry_is_the_pil_transpose_that_augment_classes_trains_with() -> None:
    assert list(SYMMETRIES) == list(CLASS_TRANSFORMS)
    pixels = (np.random.default_rng(0).random((5, 7)) * 255).astype(np.uint8)  # not square: the axes matter
    for name, transpose in CLASS_TRANSFORMS.items():
        expected = np.asarray(Image.fromarray(pixels).transpose(transpose))
        got = SYMMETRIES[name](torch.from_numpy(pixels)[None, None])[0, 0].numpy()
        assert got.shape == expected.shape and np.array_equal(got, expected), name


def test_the_copies_embeddings_stand_beside_the_images_own_with_the_mean_cosine() -> None:
    torch.manual_seed(0)
    model = build_embedder({**MODEL, "tta_symmetries": ["transpose", "rot180"]}).eval()
    model.set_whitening(torch.eye(8) + torch.randn(8, 8) / 4)
    x = torch.randn(6, 1, 28, 28)
    with torch.no_grad():
        got = model(x)
        model.set_views(model.tta_shifts, model.tta_rotations)  # the images' own: views and whitening, no copies
        parts = [model(x), model(x.transpose(2, 3)), model(torch.rot90(x, 2, (2, 3)))]
    assert model.dim == 8 and got.shape == (6, 24)
    torch.testing.assert_close(got, torch.cat(parts, dim=1) / math.sqrt(3))
    cosines = torch.stack([p @ p[0] for p in parts]).mean(0)  # of every image to the first, copy by copy
    torch.testing.assert_close(got @ got[0], cosines)
    assert np.abs(torch.linalg.norm(got, dim=1).numpy() - 1).max() < 1e-5
    model.set_views(model.tta_shifts, model.tta_rotations, ["transpose", "rot180"])
    assert model.dim == 24 and model.part_dim == 8
    model.train()
    assert model(x).shape == (6, 8)  # a training step sees the images' own embeddings only


def test_a_model_with_copies_exports_saves_and_loads_them(tmp_path) -> None:
    torch.manual_seed(0)
    model = build_embedder({**MODEL, "tta_symmetries": ["rot90", "flip_lr", "transverse"]}).eval()
    torch.save({**model.checkpoint(), "epoch": 1}, tmp_path / "m.pt")
    again = load_embedder(tmp_path / "m.pt")
    assert again.tta_symmetries == ["rot90", "flip_lr", "transverse"] and again.dim == 32
    batch = np.random.default_rng(0).normal(size=(5, 1, 28, 28)).astype(np.float32)
    report = export_onnx(again, tmp_path / "sym.onnx", batch)
    onnx_model = OnnxEmbedder(tmp_path / "sym.onnx", device="cpu")
    with torch.no_grad():
        expected = model(torch.from_numpy(batch)).numpy()
    assert report.embedding_dim == onnx_model.dim == 32
    assert np.abs(onnx_model.embed_arrays(batch) - expected).max() <= 1e-4
    assert np.abs(onnx_model.embed_arrays(batch[:2]) - expected[:2]).max() <= 1e-4  # any batch size
    assert json.loads(onnx_model.metadata["model_config"])["tta_symmetries"] == ["rot90", "flip_lr", "transverse"]
    model.set_views([], [])
    assert "tta_symmetries" not in model.config and model.dim == 8


def test_the_whitening_is_fit_on_the_images_own_embeddings() -> None:
    from metricsearch.data import load_split

    images = load_split("digits").train.subset(np.arange(120))
    torch.manual_seed(0)
    plain = build_embedder({**MODEL, "preprocessing": {"size": 28, "channels": 1}})
    with_copies = build_embedder({**plain.config, "whiten": 0.25, "tta_symmetries": ["rot90", "flip_tb"]})
    with_copies.load_state_dict(plain.state_dict())
    fit_whitening(plain.eval(), images)
    fit_whitening(with_copies.eval(), images)
    torch.testing.assert_close(with_copies.whitening, plain.whitening)
    assert with_copies.tta_symmetries == ["rot90", "flip_tb"]  # the copies are back after the fit
    assert not torch.allclose(plain.whitening, torch.eye(8), atol=0.1)


@pytest.mark.parametrize("names, message", [(["rot45"], "rot45"), (["rot90", "rot90"], "distinct")])
def test_an_unknown_or_repeated_symmetry_is_refused_by_name(names, message) -> None:
    with pytest.raises(ValueError, match=message):
        build_embedder({"dim": 8, "tta_symmetries": names})
    with pytest.raises(ValueError, match="normalize"):
        build_embedder({"dim": 8, "normalize": False, "tta_symmetries": ["rot90"]})
