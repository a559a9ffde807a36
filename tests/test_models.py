"""Embedders: preprocessing, backbones, heads, pretrained weights and checkpoints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from metricsearch.models import Preprocessing
from metricsearch.models.embedder import build_embedder, load_embedder
from metricsearch.models.backbones import BACKBONES


def test_preprocessing_round_trips_and_normalises() -> None:
    pre = Preprocessing(size=16, channels=3, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25),
                        resize="shorter_center_crop")
    assert Preprocessing.from_json(pre.to_json()) == pre
    image = Image.new("RGB", (40, 20), (255, 0, 128))
    arr = pre(image)
    assert arr.shape == (3, 16, 16) and arr.dtype == np.float32
    np.testing.assert_allclose(arr[:, 8, 8], [(1 - 0.5) / 0.25, (0 - 0.5) / 0.25, (128 / 255 - 0.5) / 0.25], atol=1e-5)


def test_stretch_keeps_the_whole_image_and_crop_keeps_the_centre() -> None:
    image = Image.new("L", (60, 20), 0)
    image.paste(255, (0, 0, 10, 20))  # a white band at the far left
    stretch = Preprocessing(size=12, resize="stretch")(image)
    crop = Preprocessing(size=12, resize="shorter_center_crop")(image)
    assert stretch[0, :, 0].min() > 0.9  # normalised white is (1 - 0.5) / 0.5 = 1
    assert crop[0].max() < -0.9  # the band is cropped away


@pytest.mark.parametrize("bad", [dict(channels=2), dict(size=4), dict(resize="fit"), dict(mean=(0.1, 0.2))])
def test_bad_preprocessing_is_rejected(bad) -> None:
    with pytest.raises(ValueError, match="preprocessing"):
        Preprocessing(**bad)


@pytest.mark.parametrize("backbone, size, channels", [
    ("small_cnn", 28, 1), ("resnet18", 32, 3), ("resnet50", 32, 3), ("googlenet", 32, 3), ("resnet18", 32, 1),
])
def test_every_backbone_embeds_to_dim(backbone: str, size: int, channels: int) -> None:
    pre = {"size": size, "channels": channels, "mean": [0.5] * channels, "std": [0.5] * channels}
    model = build_embedder({"backbone": backbone, "dim": 24, "preprocessing": pre}).eval()
    with torch.no_grad():
        out = model(torch.randn(2, channels, size, size))
    assert out.shape == (2, 24)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(2))


def test_unnormalised_head() -> None:
    model = build_embedder({"dim": 8, "normalize": False}).eval()
    with torch.no_grad():
        out = model(torch.randn(3, 1, 28, 28))
    assert not torch.allclose(out.norm(dim=1), torch.ones(3))


def test_imagenet_weights_are_never_downloaded() -> None:
    cached = Path(torch.hub.get_dir()) / "checkpoints"
    if any(cached.glob("resnet18-*.pth")):
        pytest.skip("resnet18 ImageNet weights are in the local cache on this machine")
    with pytest.raises(FileNotFoundError, match="never downloads"):
        build_embedder({"backbone": "resnet18", "preprocessing": {"channels": 3, "mean": [0.5] * 3, "std": [0.5] * 3}},
                       pretrained="imagenet")


def test_pretrained_weights_from_a_file(tmp_path) -> None:
    source = BACKBONES.build("small_cnn", None, in_channels=1)
    torch.save(source.state_dict(), tmp_path / "w.pt")
    model = build_embedder({"backbone": "small_cnn"}, pretrained=str(tmp_path / "w.pt"))
    for key, value in source.state_dict().items():
        assert torch.equal(model.backbone.state_dict()[key], value)
    with pytest.raises(FileNotFoundError, match="no such file"):
        build_embedder({"backbone": "small_cnn"}, pretrained=str(tmp_path / "missing.pt"))


def test_unknown_backbone_and_model_keys() -> None:
    with pytest.raises(ValueError, match="resnet18"):
        build_embedder({"backbone": "resnet19"})
    with pytest.raises(ValueError, match="unknown model key"):
        build_embedder({"backbone": "small_cnn", "depth": 3})


def test_checkpoint_round_trip(tmp_path) -> None:
    model = build_embedder({"dim": 16}).eval()
    torch.save(model.checkpoint(), tmp_path / "m.pt")
    loaded = load_embedder(tmp_path / "m.pt")
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))
    with pytest.raises(ValueError, match="not a metricsearch checkpoint"):
        torch.save({"weights": 1}, tmp_path / "other.pt")
        load_embedder(tmp_path / "other.pt")
