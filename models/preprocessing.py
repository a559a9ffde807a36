"""The preprocessing an embedder expects: size, channels, resize policy, mean/std; serialisable."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import cached_property

import numpy as np
from PIL import Image

RESIZE_POLICIES = ("stretch", "shorter_center_crop", "ink_box")
#: ink_box's default `ink_fill`: the ink's longer side fills this fraction of the square it is centred in
INK_FILL = 0.8
#: ink_box: a pixel is ink when its grey level differs from the background's (the border's median) by more than this
INK_CONTRAST = 64
#: ink_box: the largest square side made at full scale; a larger square (the ink of a long image far apart) is reduced
INK_SQUARE_SIDE = 2048
#: ink_box: pixels read at a time to find the ink and to make the square (temporaries of a strip, not of the image)
STRIP_PIXELS = 1 << 20


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
    ink_width: float | None = None  # ink_box: the strokes thickened or thinned to this width in output pixels
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
        if self.ink_width is not None and not self.ink_width > 0:
            raise ValueError(f"preprocessing ink_width must be > 0 pixels or null, got {self.ink_width}")
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
            # the paper's level from the whole drawing: the square's own border may be ink where the ink fills it
            square, level = _ink_square(image, self.ink_fill)
            if self.ink_width is not None:
                square = ink_stroke(square, self.ink_width * square.width / self.size, level)
            return square.resize((self.size, self.size), resample)
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

    def normalized(self, image: Image.Image | np.ndarray) -> np.ndarray:
        """A resized image (or its 8-bit pixels) as a normalised float32 C x H x W array."""
        return self.normalized_batch(np.asarray(image, dtype=np.uint8)[None])[0]

    def normalized_batch(self, pixels: np.ndarray) -> np.ndarray:
        """Resized images' 8-bit pixels, N x H x W (x C), as a normalised float32 N x C x H x W array."""
        pixels = pixels[..., None] if pixels.ndim == 3 else pixels
        out = np.empty((len(pixels), self.channels, *pixels.shape[1:3]), np.float32)
        for c in range(self.channels):
            np.take(self.lookup[c], pixels[..., c], out=out[:, c])
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
    with the background's colour where it leaves the image; the whole image when it has no ink. A square over
    INK_SQUARE_SIDE pixels comes reduced by the smallest whole factor that brings it within (block means)."""
    return _ink_square(image, fill)[0]


def _ink_square(image: Image.Image, fill: float) -> tuple[Image.Image, int]:
    """`ink_square` and the paper's grey level (the median of the image's border), from one grey copy whose ink is
    found a strip of rows at a time; the square no larger than INK_SQUARE_SIDE however far apart the ink lies."""
    grey = _grey(image)
    level = _paper(grey)
    inked_rows, inked_cols = np.zeros(grey.shape[0], bool), np.zeros(grey.shape[1], bool)
    step = max(1, STRIP_PIXELS // grey.shape[1])
    for top in range(0, grey.shape[0], step):
        ink = _ink(grey[top:top + step], level)
        inked_rows[top:top + step] = ink.any(axis=1)
        inked_cols |= ink.any(axis=0)
    del grey  # freed before the square is made
    rows, cols = np.flatnonzero(inked_rows), np.flatnonzero(inked_cols)
    if rows.size == 0:
        return image, level
    left, top, right, bottom = int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1
    side = round(max(bottom - top, right - left) / fill)  # >= 1: the box holds a pixel and fill <= 1
    factor = -(-side // INK_SQUARE_SIDE)
    side = -(-side // factor) * factor  # whole blocks (the same side when factor is 1)
    x0, y0 = (left + right - side) // 2, (top + bottom - side) // 2
    background = level if image.mode == "L" else tuple(int(v) for v in np.median(_edges(image), axis=0))
    if factor > 1:
        return _reduced_square(image, side, x0, y0, background, factor), level
    square = Image.new(image.mode, (side, side), background)
    square.paste(image, (-x0, -y0))
    return square, level


def _reduced_square(image: Image.Image, side: int, x0: int, y0: int, background: int | tuple[int, ...],
                    factor: int) -> Image.Image:
    """The side x side square of `image` whose corner is at (x0, y0), padded with `background`, each factor x factor
    block the mean of its pixels (`Image.reduce`; `side` a multiple of `factor`), made a strip of blocks at a time."""
    square = Image.new(image.mode, (side // factor, side // factor), background)
    first_col, end_col = max(0, -x0) // factor, -(-min(side, image.width - x0) // factor)  # blocks the image is in
    first_row, end_row = max(0, -y0) // factor, -(-min(side, image.height - y0) // factor)
    rows = max(1, STRIP_PIXELS // (factor * factor * (end_col - first_col)))
    for row in range(first_row, end_row, rows):
        strip = Image.new(image.mode, ((end_col - first_col) * factor, (min(row + rows, end_row) - row) * factor),
                          background)
        strip.paste(image, (-x0 - first_col * factor, -y0 - row * factor))
        square.paste(strip.reduce(factor), (first_col, row))
    return square


def ink_stroke(image: Image.Image, width: float, level: int | None = None) -> Image.Image:
    """The drawing with its strokes thickened or thinned to a mean width of `width` pixels (measured as twice the
    ink's area over its outline), the fraction of a pixel as a blend of two whole-pixel steps. `level`: the
    paper's grey level (default: the median grey level of the image's border)."""
    pixels = np.asarray(image)
    grey = pixels if image.mode == "L" else _grey(image)
    level = _paper(grey) if level is None else level
    ink = _ink(grey, level)
    inside = ink[1:-1, 1:-1] & ink[:-2, 1:-1] & ink[2:, 1:-1] & ink[1:-1, :-2] & ink[1:-1, 2:]
    area = int(ink.sum())
    outline = area - int(inside.sum())  # ink pixels with a 4-neighbour that is not ink (or the edge)
    if outline == 0:
        return image
    step = (width - 2 * area / outline) / 2  # pixels added to (or taken from) each side of a stroke
    grow = np.minimum if (step > 0) == (level >= 128) else np.maximum  # dark ink: the minimum thickens it
    whole, part = divmod(abs(step), 1.0)
    inner = pixels
    for _ in range(int(whole)):
        inner = square_filter(inner, grow)
    outer = square_filter(inner, grow).astype(np.float32)
    blended = inner * np.float32(1 - part) + outer * np.float32(part)
    return Image.fromarray(np.rint(blended).astype(np.uint8), image.mode)


def square_filter(pixels: np.ndarray, reduce: np.ufunc) -> np.ndarray:
    """Each pixel replaced by `reduce` (minimum or maximum) over its 3 x 3 neighbourhood within the image.

    The same pixels as Pillow's MinFilter(3) / MaxFilter(3) (tests/test_models.py), in 0.01 ms instead of 0.28 ms
    for a 105 px drawing: it runs on every image that `ink_width` preprocesses and that `handwriting` augments."""
    rows = pixels.copy()
    reduce(rows[1:], pixels[:-1], out=rows[1:])
    reduce(rows[:-1], pixels[1:], out=rows[:-1])
    out = rows.copy()
    reduce(out[:, 1:], rows[:, :-1], out=out[:, 1:])
    reduce(out[:, :-1], rows[:, 1:], out=out[:, :-1])
    return out


def _border(pixels: np.ndarray) -> np.ndarray:
    """The pixels of an image's four edges."""
    return np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])


def _edges(image: Image.Image) -> np.ndarray:
    """`_border` of an image's pixels, from four one-pixel crops: no copy of the image."""
    w, h = image.size
    top, bottom, left, right = (np.asarray(image.crop(box))
                                for box in ((0, 0, w, 1), (0, h - 1, w, h), (0, 0, 1, h), (w - 1, 0, w, h)))
    return np.concatenate([top[0], bottom[0], left[:, 0], right[:, 0]])


def _grey(image: Image.Image) -> np.ndarray:
    """An image's grey levels (a copy of an L image's pixels, or the image converted to L)."""
    return np.asarray(image if image.mode == "L" else image.convert("L"))


def _paper(grey: np.ndarray) -> int:
    return int(np.median(_border(grey)))


def _ink(grey: np.ndarray, level: int) -> np.ndarray:
    """A drawing's ink mask: grey levels more than INK_CONTRAST from the paper's `level`."""
    return np.abs(grey.astype(np.int16) - level) > INK_CONTRAST
