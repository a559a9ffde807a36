"""Training augmentations on the resized PIL image, each chosen by name from its registry like the losses."""

from __future__ import annotations

from typing import Any, Callable

from PIL import Image

from metricsearch.registry import Registry

Augment = Callable[[Image.Image], Image.Image]

AUGMENTATIONS: Registry[Augment | None] = Registry("augmentation")


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


def build_augment(section: dict[str, Any], size: int) -> Augment | None:
    """The augmentation of an `augment` section (name plus its parameters) for images of `size` pixels, or None."""
    params = dict(section)
    return AUGMENTATIONS.build(params.pop("name"), {"size": size}, **params)
