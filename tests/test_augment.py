"""The batch augmentation (batch_affine): torchvision's warp, its fill, whole-pixel shifts, and its place in a step."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

from metricsearch.train.augment import BatchAffine, affine_batch, build_augment
from metricsearch.train.config import load_config, typed_config
from metricsearch.train.trainer import build_setup, epoch_batches, train_step

IDENTITY = {"degrees": 0, "translate": [0, 0], "scale": [1, 1], "shear": 0}


def test_each_image_is_warped_as_torchvisions_affine_warps_it_alone() -> None:
    images = torch.rand(6, 3, 28, 20, generator=torch.Generator().manual_seed(0))
    angle = torch.tensor([0.0, 10.0, -7.5, 30.0, 90.0, -45.0])
    shift = torch.tensor([[0.0, 0.0], [2.0, -1.0], [-3.0, 2.0], [1.0, 1.0], [0.0, 0.0], [4.0, -2.0]])
    scale = torch.tensor([1.0, 1.1, 0.9, 1.05, 1.0, 0.8])
    shear = torch.tensor([0.0, 5.0, -3.0, 0.0, 0.0, 10.0])
    ours = affine_batch(images, angle, shift, scale, shear, [0.0, 0.0, 0.0])
    for i in range(len(images)):
        theirs = TF.affine(images[i], angle=float(angle[i]), translate=[int(shift[i, 0]), int(shift[i, 1])],
                           scale=float(scale[i]), shear=[float(shear[i]), 0.0],
                           interpolation=InterpolationMode.BILINEAR)
        torch.testing.assert_close(ours[i], theirs, atol=1e-5, rtol=0)
    assert not torch.allclose(ours[1], images[1])


def test_the_warp_matches_the_per_image_pil_one_but_for_rounding() -> None:
    """On drawings (the shipped Omniglot sets, white around the ink as the fill): the same maps, the same images."""
    from metricsearch.data import load_split
    from metricsearch.models.preprocessing import Preprocessing

    pre = Preprocessing(size=28, channels=1, mean=[0.9], std=[0.3], resize="ink_box", ink_fill=0.9)
    images = load_split("omniglot", split="all").train
    draws = torch.Generator().manual_seed(0)
    for i in range(0, 2000, 100):
        image = pre.resized(images.load(i))
        angle, scale, shear = (float(torch.empty(1).uniform_(lo, hi, generator=draws))
                               for lo, hi in ((-15, 15), (0.9, 1.1), (-5, 5)))
        dx, dy = (int(v) for v in torch.randint(-3, 4, (2,), generator=draws))
        pil = TF.affine(image, angle, [dx, dy], scale, [shear, 0.0], interpolation=InterpolationMode.BILINEAR,
                        fill=255)
        ours = affine_batch(torch.from_numpy(pre.normalized(image))[None], torch.tensor([angle]),
                            torch.tensor([[float(dx), float(dy)]]), torch.tensor([scale]), torch.tensor([shear]),
                            [(1 - 0.9) / 0.3])[0]
        error = (torch.from_numpy(pre.normalized(pil)) - ours).abs() * 0.3 * 255  # in 0-255 pixel units
        assert float(error.mean()) < 0.5 and float(error.max()) < 8, (i, float(error.mean()), float(error.max()))


def test_the_uncovered_border_is_the_fill_in_normalised_units() -> None:
    mean, std = [0.9], [0.3]
    augment = build_augment({"name": "batch_affine", "degrees": 30, "translate": [0.2, 0.2], "fill": 255}, 28,
                            mean, std)
    background = (1.0 - 0.9) / 0.3  # white (255) after the preprocessing's normalisation
    plain = torch.full((16, 1, 28, 28), background)
    torch.testing.assert_close(augment(plain), plain, atol=1e-6, rtol=0)
    ink = plain.clone()
    ink[:, :, 10:18, 10:18] = (0.0 - 0.9) / 0.3
    out = augment(ink)
    assert out.min() < background - 1 and torch.allclose(out[:, :, 0, 0], plain[:, :, 0, 0])


def test_identity_parameters_leave_the_batch_unchanged_and_shifts_are_whole_pixels() -> None:
    images = torch.rand(8, 2, 24, 24, generator=torch.Generator().manual_seed(1))
    same = BatchAffine([0.5, 0.5], [0.5, 0.5], **IDENTITY)
    torch.testing.assert_close(same(images), images, atol=1e-5, rtol=0)

    shifting = BatchAffine([0.5, 0.5], [0.5, 0.5], **{**IDENTITY, "translate": [0.25, 0.25]})
    fill = (0 - 0.5) / 0.5
    torch.manual_seed(3)
    moved = shifting(images)
    seen = set()
    for before, after in zip(images, moved):
        matches = []
        for dy in range(-6, 7):
            for dx in range(-6, 7):
                expected = torch.full_like(before, fill)
                ys, xs = slice(max(dy, 0), 24 + min(dy, 0)), slice(max(dx, 0), 24 + min(dx, 0))
                expected[:, ys, xs] = before[:, max(-dy, 0):24 - max(dy, 0), max(-dx, 0):24 - max(dx, 0)]
                if torch.allclose(after, expected, atol=1e-5):
                    matches.append((dx, dy))
        assert len(matches) == 1, matches
        seen.add(matches[0])
    assert len(seen) > 1


def test_the_same_seed_draws_the_same_maps() -> None:
    augment = BatchAffine([0.5], [0.5], degrees=15, translate=[0.1, 0.1], scale=[0.9, 1.1], shear=5)
    images = torch.rand(4, 1, 28, 28, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(7)
    first = augment(images)
    torch.manual_seed(7)
    assert torch.equal(augment(images), first)
    assert not torch.equal(augment(images), first)


@pytest.mark.parametrize("params, message", [
    ({"degrees": -1}, "degrees and shear must be 0 or more"),
    ({"translate": [0.1, 1.5]}, "translate must be two fractions"),
    ({"scale": [1.2, 1.0]}, "scale must be"),
])
def test_bad_parameters_are_refused_with_the_rule(params, message) -> None:
    with pytest.raises(ValueError, match=message):
        BatchAffine([0.5], [0.5], **params)
    with pytest.raises(ValueError, match="one value per channel"):
        BatchAffine([0.5, 0.5], [0.5])


def step_loss(augment: str) -> float:
    """The loss of the first training step on digits with this augment section, from the same seed."""
    setup = build_setup(typed_config(load_config(None, ["model.dim=16", "channels_last=false", f"augment={augment}"])))
    images, labels, indices = next(iter(epoch_batches(setup, seed=0)))
    return float(train_step(setup, images, labels, indices))


def test_a_training_step_applies_the_batch_augmentation_and_nothing_else() -> None:
    setup = build_setup(typed_config(load_config(None, ["model.dim=16", "augment={name: batch_affine}"])))
    assert setup.dataset.augment is None and isinstance(setup.batch_augment, BatchAffine)
    plain = step_loss("{name: none}")
    identity = step_loss("{name: batch_affine, degrees: 0, translate: [0, 0], scale: [1, 1], shear: 0}")
    warped = step_loss("{name: batch_affine, degrees: 20, translate: [0.2, 0.2]}")
    assert identity == pytest.approx(plain, abs=1e-5) and abs(warped - plain) > 1e-3
