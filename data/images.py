"""The one image loader that training, evaluation and indexing share: bounded, EXIF-upright, mode-safe."""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image, ImageOps

#: what PIL raises for files it cannot decode (a truncated file, text renamed .png, a bomb, ...)
UNREADABLE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError,
                     Image.DecompressionBombWarning)

#: the default largest image accepted, in pixels (about 8000 x 8000); larger files are refused
DEFAULT_MAX_PIXELS = 64_000_000

ImageSource = str | Path | bytes | np.ndarray | Image.Image


class UnreadableImageError(OSError):
    """An image that cannot be used: broken, not an image, too large or too small."""


def _opened(source: ImageSource) -> Image.Image:
    if isinstance(source, Image.Image):
        return source
    if isinstance(source, np.ndarray):
        return Image.fromarray(source)
    if isinstance(source, bytes):
        return Image.open(io.BytesIO(source))
    return Image.open(source)


#: pixels that `to_mode` converts at a time: its temporaries are a strip of rows, never a full-size copy
STRIP_PIXELS = 1 << 20
#: PIL modes with an alpha band, put on white by `to_mode`
ALPHA_MODES = ("PA", "LA", "RGBA", "La", "RGBa")


def to_mode(image: Image.Image, mode: str | None) -> Image.Image:
    """The image in PIL `mode` (None: RGB or L as it is), 16-bit scaled, transparency on white; a 16/32-bit, float
    or transparent image converted a strip of rows at a time (the result is its only full-size allocation)."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        peak = 65535 if image.mode.startswith("I;16") or image.getextrema()[1] > 255 else 255
        return _by_strips(image, mode or "L", lambda strip: _to_8bit(strip, peak))
    if image.mode == "F":
        return _by_strips(image, mode or "L", _clipped)
    if image.mode == "P" and "transparency" in image.info or image.mode in ALPHA_MODES:
        return _by_strips(image, mode or "RGB", _on_white)
    target = mode or ("L" if image.mode in ("1", "L") else "RGB")
    return image if image.mode == target else image.convert(target)


def _by_strips(image: Image.Image, mode: str, convert: Callable[[Image.Image], Image.Image]) -> Image.Image:
    """`convert` (pixel by pixel) applied to strips of `image`'s rows, pasted (so converted) into a new `mode` image."""
    out = Image.new(mode, image.size)
    rows = max(1, STRIP_PIXELS // max(1, image.width))
    for top in range(0, image.height, rows):
        out.paste(convert(image.crop((0, top, image.width, min(top + rows, image.height)))), (0, top))
    return out


def _to_8bit(image: Image.Image, peak: int) -> Image.Image:
    """A 16- or 32-bit integer image as 8-bit L, rounded from 0..peak."""
    pixels = np.clip(np.asarray(image), 0, peak).astype(np.int64)
    return Image.fromarray(((pixels * 255 + peak // 2) // peak).astype(np.uint8), "L")  # round(value * 255 / peak)


def _clipped(image: Image.Image) -> Image.Image:
    """A float image as 8-bit L, clipped to 0..255."""
    return Image.fromarray(np.clip(np.asarray(image), 0, 255).astype(np.uint8), "L")


def _on_white(image: Image.Image) -> Image.Image:
    """A transparent image as RGB, put on white."""
    rgba = image.convert("RGBA")
    return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")


def _draft(image: Image.Image, shorter: int, longer: int) -> None:
    """Ask the JPEG decoder for the largest reduction that keeps both sides above the minimums."""
    w, h = image.size
    for scale in (8, 4, 2):
        if min(w, h) // scale >= shorter and max(w, h) // scale >= longer:
            image.draft(image.mode, (w // scale, h // scale))
            return


def pixel_count(source: str | Path | bytes | Image.Image) -> int:
    """Width x height of an image, from a file's header alone (nothing is decoded); 0 when it cannot be read."""
    if isinstance(source, Image.Image):
        return source.width * source.height
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with _opened(source) as image:
                return image.width * image.height
    except UNREADABLE_ERRORS:
        return 0


def load_image(
    source: ImageSource, mode: str | None = None, max_pixels: int | None = DEFAULT_MAX_PIXELS,
    min_side: int = 1, *, draft: tuple[int, int] | None = None, name: str | None = None,
) -> Image.Image:
    """A fully decoded image (first frame, EXIF orientation applied) or UnreadableImageError saying why.

    `draft` = (shorter, longer) lets a JPEG decode at the smallest scale (1/2, 1/4, 1/8) whose
    shorter and longer sides are still at least that many pixels: faster, and a large photo
    never decodes at full size. `name` names the image in error messages (default: the path)."""
    name = name or (source if isinstance(source, (str, Path)) else "image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = _opened(source)
            pixels = image.size[0] * image.size[1]
            if max_pixels is not None and pixels > max_pixels:
                raise UnreadableImageError(
                    f"{name}: {image.size[0]}x{image.size[1]} = {pixels} pixels is over the limit of "
                    f"{max_pixels} (a decompression bomb?)"
                )
            if getattr(image, "is_animated", False):
                image.seek(0)
            if draft and image.format == "JPEG":
                _draft(image, *draft)
            image.load()
            if image is source:  # the caller's image: turned upright on a copy
                image = ImageOps.exif_transpose(image)
            else:
                ImageOps.exif_transpose(image, in_place=True)
            image = to_mode(image, mode)
    except UnreadableImageError:
        raise
    except FileNotFoundError as exc:
        raise UnreadableImageError(f"{name}: no such file") from exc
    except Image.UnidentifiedImageError as exc:
        raise UnreadableImageError(f"{name}: not an image (no known image format)") from exc
    except UNREADABLE_ERRORS as exc:
        reason = str(exc) or type(exc).__name__
        raise UnreadableImageError(f"{name}: not a readable image ({reason})") from exc
    if min(image.size) < min_side:
        raise UnreadableImageError(f"{name}: {image.size[0]}x{image.size[1]} is smaller than {min_side} px")
    return image
