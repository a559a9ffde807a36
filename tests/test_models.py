"""Embedders: preprocessing, backbones, heads, pretrained weights and checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter

from metricsearch.models import Preprocessing
from metricsearch.models.preprocessing import INK_FILL, ink_square, ink_stroke
from metricsearch.models.torch_embedder import build_embedder, load_embedder
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


@pytest.mark.parametrize("fill", [INK_FILL, 0.5, 1.0])
@pytest.mark.parametrize("box", [(10, 30, 40, 45), (0, 0, 12, 60), (70, 50, 100, 100)])
def test_ink_box_centres_the_ink_and_fills_the_set_fraction(box, fill) -> None:
    """ink_box: a dark stroke anywhere on white ends centred, its longer side `fill` of the square."""
    image = Image.new("L", (100, 100), 255)
    image.paste(0, box)
    ink = np.asarray(ink_square(image, fill)) < 128
    rows, cols = np.nonzero(ink)
    side = max(box[2] - box[0], box[3] - box[1])
    assert ink.shape[0] == ink.shape[1] == round(side / fill)
    assert max(rows.max() + 1 - rows.min(), cols.max() + 1 - cols.min()) == side  # the ink is whole, not clipped
    assert abs((rows.min() + rows.max() + 1) - ink.shape[0]) <= 1  # centred: as much white above as below
    assert abs((cols.min() + cols.max() + 1) - ink.shape[1]) <= 1
    assert np.asarray(ink_square(image, fill))[~ink].min() == 255  # padded with the background's white


def test_ink_fill_travels_with_the_preprocessing_and_is_checked() -> None:
    pre = Preprocessing(resize="ink_box", ink_fill=0.9)
    assert Preprocessing.from_json(pre.to_json()) == pre
    assert Preprocessing.from_dict({"resize": "ink_box"}).ink_fill == INK_FILL  # metadata written before the key
    image = Image.new("L", (100, 100), 255)
    image.paste(0, (20, 20, 60, 40))
    ink = np.asarray(Preprocessing(size=45, resize="ink_box", ink_fill=0.9).resized(image)) < 128
    assert np.ptp(np.nonzero(ink)[1]) + 1 in (40, 41)  # 40 px of ink in a 44 px square, resized to 45
    for bad in (0, 1.2):
        with pytest.raises(ValueError, match="ink_fill"):
            Preprocessing(resize="ink_box", ink_fill=bad)


def test_ink_box_pads_with_the_background_colour_and_keeps_a_blank_image() -> None:
    photo = Image.new("RGB", (50, 40), (200, 220, 240))
    photo.paste((0, 0, 0), (10, 10, 30, 14))
    out = Preprocessing(size=10, channels=3, mean=(0.5,) * 3, std=(0.5,) * 3, resize="ink_box").resized(photo)
    assert out.size == (10, 10) and np.asarray(out)[0, 0].tolist() == [200, 220, 240]
    blank = Image.new("L", (30, 20), 255)
    assert ink_square(blank) is blank


def _drawing(width: int, ink: int = 0, paper: int = 255) -> Image.Image:
    """Two strokes `width` px wide and 80 px long that do not touch (`width` <= 15), in a 95 px box on a 120 px
    square."""
    image = Image.new("L", (120, 120), paper)
    image.paste(ink, (10, 25, 10 + width, 105))
    image.paste(ink, (25, 10, 105, 10 + width))
    return image


def _mean_width(image: Image.Image) -> float:
    """Dark ink's mass over the strokes' length (160 px in all): the mean stroke width a reader would see."""
    return float((1 - np.asarray(image, np.float64) / 255).sum() / 160)


@pytest.mark.parametrize("start", [2, 3, 6])
@pytest.mark.parametrize("target", [2.0, 3.5, 5.0, 8.0])
def test_ink_stroke_brings_strokes_to_the_set_width(start, target) -> None:
    """Whole pixels as a 3 x 3 minimum (dark ink) per step, the fraction of a step as a blend: the mean width
    lands on the target however thick the strokes were."""
    out = ink_stroke(_drawing(start), target)
    assert out.size == (120, 120) and out.mode == "L"
    assert abs(_mean_width(out) - target) <= 0.1 * target  # within 10%: the strokes' ends grow too
    light = ink_stroke(_drawing(start, ink=255, paper=0), target)  # light ink on dark paper
    np.testing.assert_allclose(np.asarray(light, int), 255 - np.asarray(out, int), atol=1)  # halves round up
    assert ink_stroke(Image.new("L", (30, 30), 255), target).getextrema() == (255, 255)  # no ink, no change


def test_ink_stroke_steps_are_the_square_rank_filters() -> None:
    """One whole step each way is Pillow's 3 x 3 minimum or maximum filter, on grey and colour images."""
    rng = np.random.default_rng(0)
    grey = Image.fromarray(np.where(rng.random((40, 50)) < 0.02, 0, 255).astype(np.uint8))
    width = 2 * (np.asarray(grey) < 128).sum() / _outline(np.asarray(grey) < 128)
    np.testing.assert_array_equal(np.asarray(ink_stroke(grey, width + 2)),
                                  np.asarray(grey.filter(ImageFilter.MinFilter(3))))
    np.testing.assert_array_equal(np.asarray(ink_stroke(grey, width + 4)),
                                  np.asarray(grey.filter(ImageFilter.MinFilter(5))))
    colour = Image.merge("RGB", [grey, grey.point(lambda v: v // 2 + 100), grey])
    np.testing.assert_array_equal(np.asarray(ink_stroke(colour, width + 2)),
                                  np.asarray(colour.filter(ImageFilter.MinFilter(3))))
    thick = grey.filter(ImageFilter.MinFilter(5))
    width = 2 * (np.asarray(thick) < 128).sum() / _outline(np.asarray(thick) < 128)
    np.testing.assert_array_equal(np.asarray(ink_stroke(thick, width - 2)),
                                  np.asarray(thick.filter(ImageFilter.MaxFilter(3))))


def _outline(ink: np.ndarray) -> int:
    """Ink pixels with a 4-neighbour that is paper or beyond the edge, counted pixel by pixel."""
    h, w = ink.shape
    return sum(1 for y in range(h) for x in range(w) if ink[y, x] and any(
        not (0 <= y + dy < h and 0 <= x + dx < w) or not ink[y + dy, x + dx]
        for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1))))


def test_ink_width_travels_with_the_preprocessing_and_is_checked() -> None:
    pre = Preprocessing(size=50, resize="ink_box", ink_fill=0.95, ink_width=3.0)
    assert Preprocessing.from_json(pre.to_json()) == pre
    assert Preprocessing.from_dict({"resize": "ink_box"}).ink_width is None  # metadata written before the key
    for start in (2, 6):  # the 95 px box in a 100 px square, resized to 50: half an output px per drawing px
        thin = Preprocessing(size=50, resize="ink_box", ink_fill=0.95).resized(_drawing(start))
        even = pre.resized(_drawing(start))
        assert abs(_mean_width(thin) * 2 - start / 2) <= 0.1 * start / 2  # without: the drawing's own, halved
        assert abs(_mean_width(even) * 2 - 3.0) <= 0.1 * 3.0  # with: 3 output px, whatever the drawing's
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="ink_width"):
            Preprocessing(resize="ink_box", ink_width=bad)


def _resized_then_cropped(pre: Preprocessing, image: Image.Image) -> np.ndarray:
    """shorter_center_crop by its definition: the whole image resized, then the centre cropped."""
    w, h = image.size
    scale = pre.size / pre.crop_ratio / min(w, h)
    whole = image.resize((max(pre.size, round(w * scale)), max(pre.size, round(h * scale))), Image.BILINEAR)
    left, top = (whole.width - pre.size) // 2, (whole.height - pre.size) // 2
    return np.asarray(whole.crop((left, top, left + pre.size, top + pre.size)), dtype=np.int16)


@pytest.mark.parametrize("size", [(640, 480), (500, 375), (333, 500), (257, 300), (224, 224), (1000, 90), (90, 1000)])
def test_the_crop_is_resized_alone_as_if_the_whole_image_were(size) -> None:
    pre = Preprocessing(size=224, channels=3, mean=(0.5,) * 3, std=(0.25,) * 3, resize="shorter_center_crop")
    rng = np.random.default_rng(size[0])
    photo = Image.fromarray(rng.integers(0, 256, (size[1] // 8 + 1, size[0] // 8 + 1, 3), dtype=np.uint8))
    photo = photo.resize(size, Image.BICUBIC)  # smooth colour fields with edges, like a photo
    ours = np.asarray(pre.resized(photo), dtype=np.int16)
    reference = _resized_then_cropped(pre, photo)
    assert ours.shape == reference.shape == (224, 224, 3)
    assert np.abs(ours - reference).max() <= 1  # the same samples; at most one level of fixed-point rounding apart


@pytest.mark.parametrize("channels", [1, 3])
def test_normalisation_equals_its_formula(channels: int) -> None:
    mean, std = (0.485, 0.456, 0.406)[:channels], (0.229, 0.224, 0.225)[:channels]
    pre = Preprocessing(size=8, channels=channels, mean=mean, std=std)
    pixels = np.random.default_rng(channels).integers(0, 256, (8, 8, channels), dtype=np.uint8)
    image = Image.fromarray(pixels[..., 0] if channels == 1 else pixels)
    expected = (pixels.transpose(2, 0, 1) / 255.0 - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
    out = pre.normalized(image)
    assert out.dtype == np.float32 and out.flags.c_contiguous and out.shape == (channels, 8, 8)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    stack = np.stack([pixels, 255 - pixels])  # a batch: N x H x W x C, or N x H x W for one channel
    batch = pre.normalized_batch(stack[..., 0] if channels == 1 else stack)
    assert batch.shape == (2, channels, 8, 8) and np.array_equal(batch[0], out)
    np.testing.assert_allclose(batch[1], (1 - pixels.transpose(2, 0, 1) / 255.0 - np.array(mean)[:, None, None])
                               / np.array(std)[:, None, None], rtol=1e-6, atol=1e-6)


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


def test_small_cnn_pools_its_last_map_by_mean_or_max() -> None:
    torch.manual_seed(0)
    x = torch.rand(3, 1, 28, 28)
    avg = BACKBONES.build("small_cnn", None, in_channels=1, width=8).eval()
    top = BACKBONES.build("small_cnn", None, in_channels=1, width=8, pool="max").eval()
    top.load_state_dict(avg.state_dict())
    cells = avg.features(x)
    assert cells.shape[2:] == (2, 2)
    assert torch.allclose(avg(x), cells.mean(dim=(2, 3)))
    assert torch.allclose(top(x), cells.amax(dim=(2, 3)))
    with pytest.raises(ValueError, match="pool must be avg or max"):
        BACKBONES.build("small_cnn", None, in_channels=1, pool="sum")


def _blocks_by_hand(net, x: torch.Tensor, pool_first: bool) -> torch.Tensor:
    """SmallCNN's feature map from its own layers, block by block in the textbook order: conv-BN-ReLU-pool, or with
    `pool_first` conv-pool-BN-ReLU."""
    convs = [m for m in net.features if isinstance(m, torch.nn.Conv2d)]
    norms = [m for m in net.features if isinstance(m, torch.nn.BatchNorm2d)]
    pool = torch.nn.functional.max_pool2d
    for conv, norm in zip(convs, norms, strict=True):
        y = conv(x)
        x = torch.relu(norm(pool(y, 2, ceil_mode=True))) if pool_first else pool(torch.relu(norm(y)), 2, ceil_mode=True)
    return x


@pytest.mark.parametrize("pool_first", [False, True])
def test_small_cnn_blocks_give_the_textbook_maps_and_gradients(pool_first) -> None:
    torch.manual_seed(0)
    x = torch.randn(6, 1, 28, 28)
    for training in (True, False):  # batch statistics, then the running ones
        net = BACKBONES.build("small_cnn", None, in_channels=1, width=8, pool_first=pool_first).train(training)
        twin = BACKBONES.build("small_cnn", None, in_channels=1, width=8, pool_first=pool_first).train(training)
        twin.load_state_dict(net.state_dict())
        got, want = net.features(x), _blocks_by_hand(twin, x, pool_first)
        assert got.shape == want.shape == (6, 32, 2, 2)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        got.pow(2).sum().backward()
        want.pow(2).sum().backward()
        for (name, a), b in zip(net.named_parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0, msg=name)
    order = ["MaxPool2d", "BatchNorm2d", "ReLU"] if pool_first else ["BatchNorm2d", "ReLU", "MaxPool2d"]
    assert [type(m).__name__ for m in net.features[:4]] == ["Conv2d", *order]


def test_a_pool_first_small_cnn_exports_with_parity_and_is_typed(tmp_path) -> None:
    from metricsearch.models.onnx_embedder import OnnxEmbedder
    from metricsearch.train.config import load_config, typed_config
    from metricsearch.train.export import export_onnx

    torch.manual_seed(0)
    model = build_embedder({"dim": 8, "backbone_params": {"width": 8, "pool": "max", "pool_first": True},
                            "preprocessing": {"size": 28, "channels": 1}})
    for m in model.modules():  # running statistics of a trained model, and negative scales (BN after the max-pool)
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2), m.weight.data.uniform_(-1, 1)
    batch = np.random.default_rng(0).normal(size=(5, 1, 28, 28)).astype(np.float32)
    report = export_onnx(model.eval(), tmp_path / "first.onnx", batch)
    with torch.no_grad():
        expected = model(torch.from_numpy(batch)).numpy()
    assert report.embedding_dim == 8
    assert np.abs(OnnxEmbedder(tmp_path / "first.onnx", device="cpu").embed_arrays(batch) - expected).max() <= 1e-4
    config = typed_config(load_config("omniglot", ["model.backbone_params.pool_first=false"]))
    assert config.model.backbone_params["pool_first"] is False
    with pytest.raises(ValueError, match="pool_first"):
        typed_config(load_config("omniglot", ["model.backbone_params.pool_first=later"]))
