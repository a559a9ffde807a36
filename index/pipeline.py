"""Indexing as three stages: reader (decode, hash, thumbnail: `ImageReader`) -> embedder (a callable
over batches, as Ray Data's map_batches takes: `EmbedStep`) -> writer (`write_batches`, one LMDB
transaction per batch, in order). An `Engine` runs them: `engines.LocalEngine` (threads here) or
`ray_engine.RayEngine` (a Ray cluster), the writer always in this process."""

from __future__ import annotations

import hashlib
import io
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

import numpy as np
from PIL import Image

from metricsearch.data import DEFAULT_MAX_PIXELS, ImageSet, UnreadableImageError, load_image
from metricsearch.evaluation.distances import normalized
from metricsearch.models import OnnxEmbedder, Preprocessing

THUMBNAIL_SIZE = 256
MIN_SIDE = 8
MAX_FILE_BYTES = 256 << 20


@dataclass(frozen=True)
class ReadSettings:
    """How the reader treats an image: pixel and byte limits, smallest side, thumbnail size, mode."""

    max_pixels: int | None = DEFAULT_MAX_PIXELS
    min_side: int = MIN_SIDE
    thumbnail_size: int = THUMBNAIL_SIZE
    max_bytes: int = MAX_FILE_BYTES
    mode: str | None = None

    def __post_init__(self) -> None:
        for name, option, value, least in (("max_pixels", "--max-pixels", self.max_pixels, 1),
                                           ("min_side", "--min-side", self.min_side, 1),
                                           ("thumbnail_size", "--thumbnail-size", self.thumbnail_size, 0),
                                           ("max_bytes", "", self.max_bytes, 1)):
            if value is not None and value < least:
                raise ValueError(f"{name}{f' ({option})' if option else ''} must be at least {least}, got {value}")

    def to_dict(self) -> dict:
        """JSON-safe form, stored in the gallery's metadata."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class ReadItem:
    """What the reader made of one image: ok (pixels, thumbnail), duplicate, or failed (reason)."""

    position: int
    source: str
    label: str | None
    status: str = "ok"
    sha256: bytes = b""
    size: int = 0
    pixels: np.ndarray | None = None
    thumbnail: bytes = b""
    reason: str = ""
    seconds: float = 0.0


def source_names(images: ImageSet, spec: str, part: str | None = None) -> list[str]:
    """Each image's source: its absolute path, or `SPEC[part]#i` for an image held in memory."""
    prefix = f"{spec}[{part}]" if part else spec
    return [os.path.abspath(item) if isinstance(item, (str, Path)) else f"{prefix}#{i}"
            for i, item in enumerate(images.items)]


def read_bytes(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """A file's bytes, or UnreadableImageError when missing, empty or larger than `max_bytes`."""
    try:
        size = os.path.getsize(path)
        if size == 0:
            raise UnreadableImageError(f"{path}: empty file (0 bytes)")
        if size > max_bytes:
            raise UnreadableImageError(f"{path}: {size} bytes is over the limit of {max_bytes} bytes")
        with open(path, "rb") as f:
            return f.read(size + 1)  # the size is known: no buffer of max_bytes for every file
    except FileNotFoundError as exc:
        raise UnreadableImageError(f"{path}: no such file") from exc
    except UnreadableImageError:
        raise
    except OSError as exc:
        raise UnreadableImageError(f"{path}: cannot read the file ({exc.strerror or exc})") from exc


def decode(data: Any, settings: ReadSettings, preprocessing: Preprocessing, name: str) -> Image.Image:
    """The image in `data` (bytes, array, PIL image) by the one loader, a JPEG decoded at a reduced
    scale that still covers the model input (both sides) and the thumbnail (the longer side)."""
    crop = preprocessing.resize == "shorter_center_crop"
    side = math.ceil(preprocessing.size / (preprocessing.crop_ratio if crop else 1))
    return load_image(data, settings.mode, settings.max_pixels, settings.min_side, name=name,
                      draft=(side, max(side, settings.thumbnail_size)))


def encode_thumbnail(image: Image.Image, size: int = THUMBNAIL_SIZE) -> bytes:
    """The image at most `size` pixels on its long side: PNG when tiny (64 x 64 or less), else JPEG.
    A large image is first shrunk by an integer factor (box filter), then resampled: a thumbnail's quality."""
    if size <= 0:
        return b""
    scale = size / max(image.size)
    if scale < 1:
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                             Image.Resampling.BILINEAR, reducing_gap=1.0)
    buf = io.BytesIO()
    if image.width * image.height <= 64 * 64:
        image.save(buf, "PNG", optimize=True)
    else:
        image.save(buf, "JPEG", quality=85)
    return buf.getvalue()


def _reason(exc: BaseException, source: str) -> str:
    text = str(exc) or type(exc).__name__
    return text[len(source) + 2:] if text.startswith(source + ": ") else text


class ImageReader:
    """Stage 1, run in decoding threads: item i -> ReadItem (bytes read once, hashed, decoded,
    preprocessed, thumbnailed). `committed(sha256)` says whether the gallery already holds an image."""

    def __init__(self, images: ImageSet, sources: list[str], preprocessing: Preprocessing, settings: ReadSettings,
                 committed: Callable[[bytes], bool] = lambda sha: False) -> None:
        self.images, self.sources, self.preprocessing = images, sources, preprocessing
        self.settings, self.committed = settings, committed

    def __call__(self, i: int) -> ReadItem:
        start = time.perf_counter()
        label = int(self.images.labels[i])
        item = ReadItem(i, self.sources[i], self.images.class_names[label] if label >= 0 else None)
        try:
            raw = self.images.items[i]
            if isinstance(raw, (str, Path)):
                data: Any = read_bytes(raw, self.settings.max_bytes)
                item.sha256, item.size = hashlib.sha256(data).digest(), len(data)
            else:
                data = np.ascontiguousarray(raw)
                item.sha256 = hashlib.sha256(f"{data.dtype}{data.shape}".encode() + data.tobytes()).digest()
                item.size = data.nbytes
            if self.committed(item.sha256):
                item.status = "duplicate"
            else:
                image = decode(data, self.settings, self.preprocessing, item.source)
                item.pixels = self.preprocessing(image)
                item.thumbnail = encode_thumbnail(image, self.settings.thumbnail_size)
        except Exception as exc:  # a hostile file never stops the job: it is reported
            item.status, item.reason = "failed", _reason(exc, item.source)
            item.pixels, item.thumbnail = None, b""
        item.seconds = time.perf_counter() - start
        return item


class EmbedStep:
    """Stage 2: embeds a batch {"pixels": N x C x H x W float32} into {"embedding": N x dim, unit length}.

    A callable class over dict batches, so a cluster engine can run it on an actor pool, e.g.
    `ray.data...map_batches(EmbedStep, fn_constructor_kwargs={"model": path}, concurrency=4)`.
    """

    def __init__(self, model: str | Path | OnnxEmbedder, device: str = "auto") -> None:
        self.embedder = model if isinstance(model, OnnxEmbedder) else OnnxEmbedder(model, device)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = dict(batch)
        out["embedding"] = normalized(self.embedder.embed_arrays(batch["pixels"]))
        return out


@dataclass
class StageTimes:
    """Seconds per stage: read (summed over the decoding threads), embed, write, index; the waits
    of the embedder for images and of the writer for embeddings; wall time of the whole job."""

    read: float = 0.0
    embed: float = 0.0
    write: float = 0.0
    index: float = 0.0
    embed_wait: float = 0.0
    write_wait: float = 0.0
    total: float = 0.0
    items: int = 0

    def to_dict(self) -> dict:
        """The seconds, rounded to milliseconds."""
        return {k: round(getattr(self, k), 3) for k in ("read", "embed", "write", "index", "embed_wait", "write_wait",
                                                        "total")}


WriteFn = Callable[[list[ReadItem], "np.ndarray | None"], Any]


def write_batches(batches: Iterable[tuple[list[ReadItem], np.ndarray | None]], write: WriteFn, times: StageTimes,
                  bar: Any = None) -> None:
    """Stage 3 under every engine: hand each embedded batch, in order, to the single writer `write`;
    times the writer's waits for batches and its writes (and moves the progress `bar`)."""
    start = time.perf_counter()
    for items, vectors in batches:
        times.write_wait += time.perf_counter() - start
        start = time.perf_counter()
        write(items, vectors)
        times.write += time.perf_counter() - start
        if bar is not None:
            bar.update(len(items))
        start = time.perf_counter()


class Engine(Protocol):
    """What runs the stages: reads the images at `positions` with `reader`, embeds them, and hands
    the batches in order to `write` (stage 3, here); returns the seconds per stage."""

    name: str

    def run(self, reader: ImageReader, positions: list[int], write: WriteFn, *, batch_size: int = 256,
            progress: bool = False, desc: str = "indexing") -> StageTimes: ...
