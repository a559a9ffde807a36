"""Training augmentations on the resized PIL image, chosen by name from the config."""

from __future__ import annotations

from typing import Any, Callable

from PIL import Image, ImageFilter

AUGMENTATIONS = ("none", "affine", "crop_flip", "handwriting")


def build_augment(config: dict[str, Any] | None, size: int) -> Callable[[Image.Image], Image.Image] | None:
    """The augmentation for an `augment` config section (name plus its parameters), or None."""
    from torchvision import transforms

    cfg = dict(config or {})
    name = cfg.pop("name", "none")
    if name == "none":
        aug = None
    elif name == "affine":
        aug = transforms.RandomAffine(
            degrees=cfg.pop("degrees", 10), translate=tuple(cfg.pop("translate", (0.1, 0.1))),
            scale=tuple(cfg.pop("scale", (0.9, 1.1))), shear=cfg.pop("shear", 0),
            fill=cfg.pop("fill", 0), interpolation=transforms.InterpolationMode.BILINEAR,
        )
    elif name == "handwriting":
        aug = Handwriting(**cfg)
        cfg = {}
    elif name == "crop_flip":
        aug = transforms.Compose([
            transforms.RandomResizedCrop(size, scale=tuple(cfg.pop("scale", (0.35, 1.0)))),
            transforms.RandomHorizontalFlip(),
        ])
    else:
        raise ValueError(f"unknown augment.name {name!r}; choose one of {', '.join(AUGMENTATIONS)}")
    if cfg:
        raise ValueError(f"augment {name!r} has no parameter(s) {sorted(cfg)}")
    return aug


class Handwriting:
    """Augmentation for drawn strokes on a plain background (Omniglot): a random affine map, then a
    random stroke width (a blend towards the image's 3x3 min filter thickens dark strokes, towards
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
