"""Training augmentations on the resized PIL image, chosen by name from the config."""

from __future__ import annotations

from typing import Any, Callable

from PIL import Image

AUGMENTATIONS = ("none", "affine", "crop_flip")


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
