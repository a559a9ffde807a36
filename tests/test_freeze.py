"""model.freeze (a frozen backbone trunk) and trunk_cache (its outputs computed once): real models, real training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from metricsearch.data import load_split
from metricsearch.models.torch_embedder import Embedder, load_checkpoint
from metricsearch.train import losses
from metricsearch.train.config import load_config
from metricsearch.train.dataset import ImageDataset
from metricsearch.train.augment import build_augment
from metricsearch.train.optim import build_optimizer
from metricsearch.train.trainer import train
from metricsearch.train.trunk_cache import build_trunk_cache

LITE0 = "timm:tf_efficientnet_lite0"  # the architecture of efficientnet_lite0, randomly initialised (no download)
GRAY32 = {"size": 32, "channels": 1, "mean": [0.5], "std": [0.5], "resize": "stretch"}


def trunk_state(model: Embedder) -> dict[str, torch.Tensor]:
    """The frozen trunk's parameters and BatchNorm buffers, copied."""
    return {f"{i}.{k}": v.clone() for i, layer in enumerate(model.trunk.layers) for k, v in layer.state_dict().items()}


@pytest.mark.parametrize("backbone", [LITE0, "resnet18"])
def test_a_training_step_leaves_the_frozen_trunk_and_every_batchnorm_statistic_unchanged(backbone) -> None:
    torch.manual_seed(0)
    model = Embedder(backbone, dim=16, preprocessing={"size": 64}, freeze=2).train()
    before = trunk_state(model)
    rest = {k: v.clone() for k, v in model.named_parameters() if v.requires_grad}
    stats = {k: v.clone() for k, v in model.backbone.state_dict().items() if "running" in k}
    assert before and rest and any(k.endswith("running_mean") for k in before)
    loss = losses.build("ms")
    optimizer = build_optimizer({"name": "adamw", "lr": 1e-2, "head_lr": 1e-2}, model, loss)
    images, labels = torch.randn(8, 3, 64, 64), torch.arange(4).repeat(2)
    value = loss(model(images), labels)
    optimizer.zero_grad()
    value.backward()
    optimizer.step()
    after = trunk_state(model)
    assert all(torch.equal(before[k], after[k]) for k in before)  # weights and running statistics alike
    changed = [k for k, v in model.named_parameters() if v.requires_grad and not torch.equal(rest[k], v)]
    assert len(changed) == len(rest)  # every parameter after the trunk learned
    assert all(p.requires_grad is False for p in model.trunk.parameters())
    statistics = {k: v for k, v in model.backbone.state_dict().items() if "running" in k}
    assert all(torch.equal(v, stats[k]) for k, v in statistics.items())  # the learning blocks' BatchNorm too
    assert not any(m.training for m in model.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d))
    assert not any(m.training for layer in model.trunk.layers for m in layer.modules())  # a fixed feature extractor
    assert model.head.training


@pytest.mark.parametrize("backbone", [LITE0, "timm:resnet18", "resnet18"])
def test_embeddings_from_the_trunk_output_equal_the_whole_model(backbone) -> None:
    torch.manual_seed(0)
    model = Embedder(backbone, dim=None, preprocessing={"size": 64}, freeze=3).eval()
    images = torch.randn(4, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(model.embed_from_trunk(model.trunk(images)), model(images), atol=1e-6)


def test_freeze_names_the_valid_range_and_the_backbones_that_have_blocks() -> None:
    with pytest.raises(ValueError, match="from 0 .* to 7"):
        Embedder(LITE0, preprocessing={"size": 32}, freeze=8)
    with pytest.raises(ValueError, match="SmallCNN backbone has no blocks to freeze"):
        Embedder("small_cnn", freeze=1)
    with pytest.raises(ValueError, match="set model.freeze too"):
        load_config("digits", ["trunk_cache=2"])
    with pytest.raises(ValueError, match="model.freeze must be an integer >= 0"):
        load_config("digits", ["model.freeze=-1"])


def test_the_trunk_cache_holds_the_live_trunk_outputs_of_seeded_augmented_views() -> None:
    torch.manual_seed(0)
    model = Embedder(LITE0, dim=8, preprocessing=GRAY32, freeze=4)
    images = load_split("digits").train.subset(list(range(40)))
    plain = ImageDataset(images, model.preprocessing)
    cache = build_trunk_cache(model, plain, copies=2, seed=0, device=torch.device("cpu"), batch_size=16)
    model.eval()
    with torch.no_grad():
        live = model.trunk(torch.stack([plain[i][0] for i in range(len(plain))]))
    assert cache.features.shape == (2, 40, *live.shape[1:])
    for view in range(2):  # float16 storage
        assert torch.allclose(cache.features[view].float(), live, rtol=1e-3, atol=1e-3)
    batch = cache.batch(torch.tensor([3, 5]), torch.Generator().manual_seed(0))
    assert torch.allclose(batch, live[[3, 5]], rtol=1e-3, atol=1e-3)
    augmented = ImageDataset(images, model.preprocessing, build_augment({"name": "crop_flip"}, 32))
    first, again = (build_trunk_cache(model, augmented, 2, 0, torch.device("cpu"), 16).features for _ in range(2))
    assert torch.equal(first, again)  # the views are seeded: a resumed run caches the same ones
    assert not torch.allclose(first[0].float(), first[1].float())  # and they differ from view to view
    warp = build_augment({"name": "batch_affine", "degrees": 20}, 32, [0.5], [0.5])  # on each batch instead
    first, again = (build_trunk_cache(model, plain, 2, 0, torch.device("cpu"), 16, augment=warp).features
                    for _ in range(2))
    assert torch.equal(first, again) and not torch.allclose(first[0].float(), first[1].float())
    assert not torch.allclose(first[0].float(), live, rtol=1e-2, atol=1e-2)


def digit_folder(root: Path, classes: int = 5, per_class: int = 8) -> Path:
    """A `folder:` data set of real digit images (PNG), `per_class` of each of the first `classes` digits."""
    images = load_split("digits").train  # digits 0-4
    for label in range(classes):
        (root / str(label)).mkdir(parents=True)
        for n, i in enumerate(np.flatnonzero(images.labels == label)[:per_class]):
            images.load(int(i)).save(root / str(label) / f"{n}.png")
    return root


def test_training_on_the_trunk_cache_learns_leaves_the_trunk_and_resumes_exactly_distilled_too(tmp_path) -> None:
    torch.manual_seed(0)
    data = digit_folder(tmp_path / "digits")
    weights = tmp_path / "lite0.pt"
    torch.save(Embedder(LITE0, dim=None, preprocessing=GRAY32).backbone.net.state_dict(), weights)
    model = {"backbone": LITE0, "dim": 16, "preprocessing": GRAY32, "freeze": 5, "pretrained": str(weights)}
    overrides = [f"model={model}", "trunk_cache=2", "epochs=2", "batches_per_epoch=2", "augment={name: crop_flip}",
                 f"dataset=folder:{data}", "split_classes=0.6",
                 "sampler={name: group, classes_per_batch: 3, images_per_class: 4}",
                 f"output_dir={tmp_path}", "eval.nmi=false", "optimizer.lr=0.01", "distill={epochs: 1}"]
    straight = train(load_config("digits", [*overrides, "name=straight"]), progress=False)
    train(load_config("digits", [*overrides, "name=paused"]), progress=False, stop_after_epoch=1)
    resumed = train(load_config("digits", [*overrides, "name=paused"]), progress=False, resume=True)
    trained, state = load_checkpoint(straight.run_dir / "last.pt")
    again = load_checkpoint(resumed.run_dir / "last.pt")[1]
    assert all(torch.equal(v, again["model"][k]) for k, v in state["model"].items())  # resumed = straight
    initial = Embedder(LITE0, dim=16, preprocessing=GRAY32, freeze=5, pretrained=str(weights))
    assert all(torch.equal(a, b) for a, b in zip(initial.trunk.parameters(), trained.trunk.parameters()))
    tail = [(a, b) for (name, a), b in zip(initial.backbone.named_parameters(), trained.backbone.parameters())
            if a.requires_grad]
    assert tail and not any(torch.equal(a, b) for a, b in tail)
    assert state["model_config"]["freeze"] == 5 and 0 < straight.test["recall_at_k"][1] <= 1
    assert state["distill_after"] == 2 and straight.last_metrics["phase"] == "distill"  # distilled on the cache


def test_with_a_trunk_cache_the_batch_augmentation_warps_the_cached_views_not_the_steps(tmp_path) -> None:
    from metricsearch.train.augment import BatchAffine
    from metricsearch.train.config import typed_config
    from metricsearch.train.trainer import build_setup

    model = {"backbone": LITE0, "dim": 8, "preprocessing": GRAY32, "freeze": 4}
    base = [f"model={model}", f"dataset=folder:{digit_folder(tmp_path / 'digits')}", "split_classes=0.6",
            "sampler={name: group, classes_per_batch: 3, images_per_class: 4}",
            "augment={name: batch_affine, degrees: 20}"]
    cached = build_setup(typed_config(load_config("digits", [*base, "trunk_cache=2"])))
    plain = build_setup(typed_config(load_config("digits", [*base, "trunk_cache=0"])))
    assert cached.trunk_cache is not None and cached.batch_augment is None and cached.dataset.augment is None
    assert isinstance(plain.batch_augment, BatchAffine) and plain.dataset.augment is None
    assert not torch.allclose(cached.trunk_cache.features[0].float(), cached.trunk_cache.features[1].float())
