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

    A random affine map, then with probability `elastic_p` an elastic distortion (`alpha`/`sigma` in
    pixels of the resized image, as torchvision's ElasticTransform), then a random stroke width (a blend
    towards the image's 3x3 min filter thickens dark strokes, towards its max filter thins them; `stroke`
    is the blend range, negative = thinner). Strokes are assumed darker than the background (`fill`).
    The elastic displacement fields are drawn once, `elastic_bank` of them, and each distortion applies
    one of them, sign-flipped at random: 9x cheaper than a new field per image."""

    def __init__(self, size: int, degrees: float = 10, translate=(0.08, 0.08), scale=(0.9, 1.1), shear: float = 5,
                 fill: int = 255, stroke=(-0.5, 0.5), elastic_p: float = 0.0, elastic_alpha: float = 8.0,
                 elastic_sigma: float = 3.0, elastic_bank: int = 512) -> None:
        import torch
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
        import torch
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
            other = image.filter(ImageFilter.MinFilter(3) if thicker else ImageFilter.MaxFilter(3))
            image = Image.blend(image, other, abs(w))
        return image
