"""Training augmentations on the resized PIL image, each chosen by name from its registry like the losses."""

from __future__ import annotations

from typing import Any, Callable

from PIL import Image, ImageFilter

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


@AUGMENTATIONS.register("handwriting")
class Handwriting:
    """Drawn strokes on a plain background (Omniglot): random affine, stroke width, elastic distortion.

    A random affine map, then a random stroke width (a blend towards the image's 3x3 min filter thickens dark strokes, towards
    its max filter thins them; `stroke` is the blend range, negative = thinner), then with
    probability `elastic_p` an elastic distortion (torchvision ElasticTransform, `alpha`/`sigma`
    in pixels of the resized image). Strokes are assumed darker than the background (`fill`)."""

    def __init__(self, degrees: float = 10, translate=(0.08, 0.08), scale=(0.9, 1.1), shear: float = 5,
                 fill: int = 255, stroke=(-0.5, 0.5), elastic_p: float = 0.0, elastic_alpha: float = 8.0,
                 elastic_sigma: float = 3.0) -> None:
        from torchvision import transforms

        interpolation = transforms.InterpolationMode.BILINEAR
        self.affine = transforms.RandomAffine(degrees=degrees, translate=tuple(translate), scale=tuple(scale),
                                              shear=shear, fill=fill, interpolation=interpolation)
        self.elastic = (transforms.ElasticTransform(alpha=float(elastic_alpha), sigma=float(elastic_sigma),
                                                    fill=fill, interpolation=interpolation)
                        if elastic_p > 0 else None)
        self.stroke, self.elastic_p = (float(stroke[0]), float(stroke[1])), float(elastic_p)
        self.dark_strokes = fill >= 128

    def __call__(self, image: Image.Image) -> Image.Image:
        """The augmented image (same size and mode)."""
        import torch

        image = self.affine(image)
        if self.elastic is not None and float(torch.rand(())) < self.elastic_p:
            image = self.elastic(image)
        lo, hi = self.stroke
        w = lo + (hi - lo) * float(torch.rand(()))
        if w != 0.0:
            thicker = (w > 0) == self.dark_strokes
            other = image.filter(ImageFilter.MinFilter(3) if thicker else ImageFilter.MaxFilter(3))
            image = Image.blend(image, other, abs(w))
        return image
