"""The preprocessing an embedder expects: size, channels, resize policy, mean/std; serialisable."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import cached_property, lru_cache

import numpy as np
from PIL import Image

RESIZE_POLICIES = ("stretch", "shorter_center_crop", "ink_box")
#: ink_box's default `ink_fill`: the ink's longer side fills this fraction of the square it is centred in
INK_FILL = 0.8
#: ink_box: a pixel is ink when its grey level differs from the background's (the border's median) by more than this
INK_CONTRAST = 64


@dataclass(frozen=True)
class Preprocessing:
    """How a PIL image becomes the float32 C x H x W array an embedder takes."""

    size: int = 28
    channels: int = 1
    mean: tuple[float, ...] = (0.5,)
    std: tuple[float, ...] = (0.5,)
    resize: str = "stretch"  # or shorter_center_crop (photos) or ink_box (drawings: the square around the ink)
    crop_ratio: float = 0.875  # shorter_center_crop: shorter side to size / crop_ratio, then crop
    ink_fill: float = INK_FILL  # ink_box: the fraction of the square that the ink's longer side fills
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        if self.channels not in (1, 3):
            raise ValueError(f"preprocessing channels must be 1 or 3, got {self.channels}")
        if self.size < 8:
            raise ValueError(f"preprocessing size must be >= 8 pixels, got {self.size}")
        if self.resize not in RESIZE_POLICIES:
            raise ValueError(f"preprocessing resize must be one of {RESIZE_POLICIES}, got {self.resize!r}")
        if not 0 < self.ink_fill <= 1:
            raise ValueError(f"preprocessing ink_fill must be in (0, 1], got {self.ink_fill}")
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            raise ValueError(
                f"preprocessing mean/std need {self.channels} value(s) each, got {self.mean} / {self.std}"
            )
        object.__setattr__(self, "mean", tuple(float(m) for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) for s in self.std))

    @property
    def mode(self) -> str:
        """PIL mode of the resized image."""
        return "L" if self.channels == 1 else "RGB"

    def resized(self, image: Image.Image) -> Image.Image:
        """The image converted to the right mode and resized to size x size by the policy."""
        image = image if image.mode == self.mode else image.convert(self.mode)
        resample = getattr(Image.Resampling, self.interpolation.upper())
        if self.resize == "ink_box":
            return ink_square(image, self.ink_fill).resize((self.size, self.size), resample)
        box = self.crop_box(*image.size) if self.resize == "shorter_center_crop" else None
        return image.resize((self.size, self.size), resample, box=box)

    def crop_box(self, width: int, height: int) -> tuple[float, float, float, float]:
        """shorter_center_crop's region of a width x height image: the centre size x size crop of the
        image resized to size / crop_ratio on its shorter side, in the original image's pixels."""
        scale = self.size / self.crop_ratio / min(width, height)
        w, h = max(self.size, round(width * scale)), max(self.size, round(height * scale))
        left, top = (w - self.size) // 2, (h - self.size) // 2
        sx, sy = w / width, h / height
        return left / sx, top / sy, (left + self.size) / sx, (top + self.size) / sy

    def normalized(self, image: Image.Image) -> np.ndarray:
        """A resized image as a normalised float32 C x H x W array."""
        pixels = np.asarray(image, dtype=np.uint8)
        pixels = pixels[..., None] if pixels.ndim == 2 else pixels
        out = np.empty((self.channels, *pixels.shape[:2]), np.float32)
        for c in range(self.channels):
            np.take(self.lookup[c], pixels[..., c], out=out[c])
        return out

    @cached_property
    def lookup(self) -> np.ndarray:
        """channels x 256 float32: each 8-bit value normalised, (value / 255 - mean) / std."""
        levels = np.arange(256, dtype=np.float32)[None, :] / 255.0
        return (levels - np.asarray(self.mean, np.float32)[:, None]) / np.asarray(self.std, np.float32)[:, None]

    def __call__(self, image: Image.Image) -> np.ndarray:
        """Resize then normalise one image."""
        return self.normalized(self.resized(image))

    def batch(self, images: list[Image.Image]) -> np.ndarray:
        """N x C x H x W float32 array of several images."""
        return np.stack([self(im) for im in images])

    def to_dict(self) -> dict:
        """Plain dict (JSON-safe)."""
        d = asdict(self)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d

    def to_json(self) -> str:
        """JSON string, as stored in checkpoints and ONNX metadata."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "Preprocessing":
        """Inverse of `to_dict`; unknown keys are an error."""
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown preprocessing key(s) {sorted(unknown)}; known: {sorted(known)}")
        d = dict(d)
        for key in ("mean", "std"):
            if key in d:
                d[key] = tuple(d[key])
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> "Preprocessing":
        """Inverse of `to_json`."""
        return cls.from_dict(json.loads(text))


def ink_square(image: Image.Image, fill: float = INK_FILL) -> Image.Image:
    """The square around a drawing's ink (centred on its bounding box, the longer side `fill` of it), padded
    with the background's colour where it leaves the image; the whole image when it has no ink."""
    grey = image if image.mode == "L" else image.convert("L")
    level = int(np.median(_border(np.asarray(grey))))
    box = grey.point(_ink_table(level)).getbbox()
    if box is None:
        return image
    left, top, right, bottom = box
    side = round(max(bottom - top, right - left) / fill)  # >= 1: the box holds a pixel and fill <= 1
    x0, y0 = (left + right - side) // 2, (top + bottom - side) // 2
    background = level if image.mode == "L" else tuple(int(v) for v in np.median(_border(np.asarray(image)), axis=0))
    square = Image.new(image.mode, (side, side), background)
    square.paste(image, (-x0, -y0))
    return square


def _border(pixels: np.ndarray) -> np.ndarray:
    """The pixels of an image's four edges."""
    return np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])


@lru_cache(maxsize=256)
def _ink_table(level: int) -> list[int]:
    """Pillow's point table: 255 for grey levels that are ink on a background of `level`, else 0."""
    return [255 * (abs(v - level) > INK_CONTRAST) for v in range(256)]
