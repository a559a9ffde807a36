"""The preprocessing an embedder expects: size, channels, resize policy, mean/std; serialisable."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np
from PIL import Image

RESIZE_POLICIES = ("stretch", "shorter_center_crop")


@dataclass(frozen=True)
class Preprocessing:
    """How a PIL image becomes the float32 C x H x W array an embedder takes."""

    size: int = 28
    channels: int = 1
    mean: tuple[float, ...] = (0.5,)
    std: tuple[float, ...] = (0.5,)
    resize: str = "stretch"
    crop_ratio: float = 0.875  # shorter_center_crop: shorter side to size / crop_ratio, then crop
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        if self.channels not in (1, 3):
            raise ValueError(f"preprocessing channels must be 1 or 3, got {self.channels}")
        if self.size < 8:
            raise ValueError(f"preprocessing size must be >= 8 pixels, got {self.size}")
        if self.resize not in RESIZE_POLICIES:
            raise ValueError(f"preprocessing resize must be one of {RESIZE_POLICIES}, got {self.resize!r}")
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
        image = image.convert(self.mode)
        resample = getattr(Image.Resampling, self.interpolation.upper())
        if self.resize == "shorter_center_crop":
            w, h = image.size
            scale = self.size / self.crop_ratio / min(w, h)
            image = image.resize((max(self.size, round(w * scale)), max(self.size, round(h * scale))), resample)
            w, h = image.size
            left, top = (w - self.size) // 2, (h - self.size) // 2
            return image.crop((left, top, left + self.size, top + self.size))
        return image.resize((self.size, self.size), resample)

    def normalized(self, image: Image.Image) -> np.ndarray:
        """A resized image as a normalised float32 C x H x W array."""
        arr = np.asarray(image, dtype=np.float32) / 255.0
        arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
        mean = np.asarray(self.mean, dtype=np.float32)[:, None, None]
        std = np.asarray(self.std, dtype=np.float32)[:, None, None]
        return np.ascontiguousarray((arr - mean) / std)

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

