"""Training augmentations on the resized PIL image, each chosen by name from its registry like the losses."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from metricsearch.models.preprocessing import square_filter
from metricsearch.registry import Registry

Augment = Callable[[Image.Image], Image.Image]

#: what training passes every augmentation that takes it (never set in a config): the image size, and the
#: preprocessing's per-channel mean and std (the batch augmentations work on normalised tensors)
AUGMENT_CONTEXT = ("size", "mean", "std")


class BatchAugment:
    """An augmentation of a whole batch of normalised images (B, C, H, W) at once, on the training device."""

    def __call__(self, images: Tensor) -> Tensor:
        raise NotImplementedError


AUGMENTATIONS: Registry[Augment | BatchAugment | None] = Registry("augmentation")


@AUGMENTATIONS.register("none")
def none() -> None:
    """No augmentation: every epoch sees the resized images as they are."""
    return None


@AUGMENTATIONS.register("affine")
def affine(
    degrees: float = 10, translate: tuple[float, float] = (0.1, 0.1), scale: tuple[float, float] = (0.9, 1.1),
    shear: float = 0, fill: float = 0,
) -> Augment:
    """Random rotation, translation, scaling and shear, the uncovered border filled with `fill`."""
    from torchvision import transforms

    return transforms.RandomAffine(
        degrees=degrees, translate=tuple(translate), scale=tuple(scale), shear=shear, fill=fill,
        interpolation=transforms.InterpolationMode.BILINEAR,
    )


@AUGMENTATIONS.register("crop_flip")
def crop_flip(size: int, scale: tuple[float, float] = (0.35, 1.0)) -> Augment:
    """A random resized crop (area fraction in `scale`) back to `size`, then a random horizontal flip."""
    from torchvision import transforms

    return transforms.Compose([
        transforms.RandomResizedCrop(size, scale=tuple(scale)), transforms.RandomHorizontalFlip(),
    ])


def build_augment(section: dict[str, Any], size: int, mean: Sequence[float] = (0.0,),
                  std: Sequence[float] = (1.0,)) -> Augment | BatchAugment | None:
    """The augmentation of an `augment` section (name plus its parameters) for images of `size` pixels normalised
    by `mean` and `std`, or None."""
    params = dict(section)
    return AUGMENTATIONS.build(params.pop("name"), {"size": size, "mean": mean, "std": std}, **params)


@AUGMENTATIONS.register("batch_affine")
class BatchAffine(BatchAugment):
    """Affine's random maps drawn per image, but applied to the whole batch at once on the training device.

    The parameters are drawn as torchvision's RandomAffine draws them (rotation, shear along x and scale uniform,
    translations whole pixels), one set per image, and the warp is torchvision's tensor affine (bilinear, the
    image's centre fixed); the uncovered border is blended with `fill` (0-255, as the image's pixels), which the
    preprocessing's `mean` and `std` carry into normalised units."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], degrees: float = 10,
                 translate: Sequence[float] = (0.1, 0.1), scale: Sequence[float] = (0.9, 1.1), shear: float = 0,
                 fill: float = 0) -> None:
        if degrees < 0 or shear < 0:
            raise ValueError(f"batch_affine: degrees and shear must be 0 or more, got {degrees} and {shear}")
        if len(translate) != 2 or not all(0 <= t <= 1 for t in translate):
            raise ValueError(f"batch_affine: translate must be two fractions in [0, 1], got {list(translate)}")
        if len(scale) != 2 or not 0 < scale[0] <= scale[1]:
            raise ValueError(f"batch_affine: scale must be [low, high] with 0 < low <= high, got {list(scale)}")
        if len(mean) != len(std):
            raise ValueError(f"batch_affine: mean and std must have one value per channel, got {mean} and {std}")
        self.degrees, self.shear = float(degrees), float(shear)
        self.translate, self.scale = (float(translate[0]), float(translate[1])), (float(scale[0]), float(scale[1]))
        self.fill = [(fill / 255 - m) / s for m, s in zip(mean, std)]

    def __call__(self, images: Tensor) -> Tensor:
        """The batch, each image warped by its own random affine map."""
        b, _, h, w = images.shape
        draw = torch.empty(5, b, device=images.device)
        draw[0].uniform_(-self.degrees, self.degrees)
        draw[1].uniform_(-self.translate[0] * w, self.translate[0] * w)
        draw[2].uniform_(-self.translate[1] * h, self.translate[1] * h)
        draw[3].uniform_(*self.scale)
        draw[4].uniform_(-self.shear, self.shear)
        return affine_batch(images, draw[0], draw[1:3].T.round(), draw[3], draw[4], self.fill)


def affine_batch(images: Tensor, angle: Tensor, translate: Tensor, scale: Tensor, shear: Tensor,
                 fill: Sequence[float]) -> Tensor:
    """Images (B, C, H, W) warped as torchvision's `functional.affine` warps one (angles in degrees, translate in
    pixels (B, 2), shear along x), each by its own parameters; outside pixels blend with `fill` (one per channel)."""
    n, _, h, w = images.shape
    rot, sx = torch.deg2rad(angle.float()), torch.deg2rad(shear.float())
    cos, sin, tan = torch.cos(rot), torch.sin(rot), torch.tan(sx)
    # torchvision's inverse of rotation x shear (det 1) x scale about the centre, then of the translation
    linear = torch.stack([torch.stack([-sin * tan + cos, cos * tan + sin], -1),
                          torch.stack([-sin, cos], -1)], -2) / scale.float()[:, None, None]
    shift = -(linear @ translate.float()[..., None])
    theta = torch.cat([linear, shift], -1).to(images.device)
    ys, xs = torch.meshgrid(torch.arange(h, device=images.device) - (h - 1) / 2,
                            torch.arange(w, device=images.device) - (w - 1) / 2, indexing="ij")
    base = torch.stack([xs, ys, torch.ones_like(xs)], -1).reshape(1, h * w, 3).float()
    half = torch.tensor([0.5 * w, 0.5 * h], device=images.device)
    grid = (base @ (theta.transpose(1, 2) / half)).reshape(n, h, w, 2)
    value = torch.tensor(list(fill), dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    return torch.nn.functional.grid_sample(images - value, grid.to(images.dtype), mode="bilinear",
                                           padding_mode="zeros", align_corners=False) + value


@AUGMENTATIONS.register("handwriting")
class Handwriting:
    """Drawn strokes on a plain background (Omniglot): random affine, stroke width, elastic distortion.

    A random affine map, then with probability `elastic_p` an elastic distortion (`alpha`/`sigma` in
    pixels of the resized image, as torchvision's ElasticTransform), then a random stroke width (a blend
    towards the image's 3x3 min filter thickens dark strokes, towards its max filter thins them; `stroke`
    is the blend range, negative = thinner). Strokes are assumed darker than the background (`fill`).
    The elastic displacement fields are drawn once, `elastic_bank` of them, and each distortion applies
    one of them, sign-flipped at random: 9x cheaper than a new field per image."""

    def __init__(self, size: int, degrees: float = 10, translate=(0.08, 0.08), scale=(0.9, 1.1), shear: float = 5,
                 fill: int = 255, stroke=(-0.5, 0.5), elastic_p: float = 0.0, elastic_alpha: float = 8.0,
                 elastic_sigma: float = 3.0, elastic_bank: int = 512) -> None:
        from torchvision import transforms

        self.interpolation = transforms.InterpolationMode.BILINEAR
        self.affine = transforms.RandomAffine(degrees=degrees, translate=tuple(translate), scale=tuple(scale),
                                              shear=shear, fill=fill, interpolation=self.interpolation)
        if elastic_p > 0 and elastic_bank < 1:
            raise ValueError(f"elastic_bank must be at least 1, got {elastic_bank}")
        self.fields = (torch.cat([transforms.ElasticTransform.get_params([float(elastic_alpha)] * 2,
                                                                         [float(elastic_sigma)] * 2, [size, size])
                                  for _ in range(elastic_bank)]) if elastic_p > 0 else None)
        self.stroke, self.elastic_p, self.fill = (float(stroke[0]), float(stroke[1])), float(elastic_p), fill
        self.dark_strokes = fill >= 128

    def __call__(self, image: Image.Image) -> Image.Image:
        """The augmented image (same size and mode)."""
        from torchvision.transforms import functional

        image = self.affine(image)
        if self.fields is not None and float(torch.rand(())) < self.elastic_p:
            field = self.fields[int(torch.randint(len(self.fields), ()))] * (1 if float(torch.rand(())) < 0.5 else -1)
            if field.shape[:2] != (image.height, image.width):  # displacements are in [-1, 1] image units
                field = torch.nn.functional.interpolate(field.permute(2, 0, 1)[None], (image.height, image.width),
                                                        mode="bilinear")[0].permute(1, 2, 0)
            image = functional.elastic_transform(image, field[None], self.interpolation, self.fill)
        lo, hi = self.stroke
        w = lo + (hi - lo) * float(torch.rand(()))
        if w != 0.0:
            thicker = (w > 0) == self.dark_strokes
            other = square_filter(np.asarray(image), np.minimum if thicker else np.maximum)
            image = Image.blend(image, Image.fromarray(other, image.mode), abs(w))
        return image
