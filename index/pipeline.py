"""Indexing as three stages that overlap: reader (threads decode, hash, thumbnail) -> embedder
(a callable over batches, as Ray Data's map_batches takes) -> writer (one LMDB transaction per
batch). Bounded queues between them keep memory flat; the slowest stage sets the pace."""

from __future__ import annotations

import hashlib
import io
import math
import os
import queue
import threading
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image

from metricsearch.data import DEFAULT_MAX_PIXELS, ImageSet, UnreadableImageError, load_image
from metricsearch.models import OnnxEmbedder, Preprocessing, ordered_batches

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


def source_names(images: ImageSet, spec: str, split: str | None = None) -> list[str]:
    """Each image's source: its absolute path, or `SPEC[split]#i` for an image held in memory."""
    prefix = f"{spec}[{split}]" if split else spec
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


def normalized(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), float32."""
    v = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return np.ascontiguousarray(v / np.where(norms > 0, norms, 1.0), dtype=np.float32)


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


class _Stop(Exception):
    pass


_DONE = object()


def run_pipeline(read: ImageReader, positions: list[int], embed: Callable[[dict], dict],
                 write: Callable[[list[ReadItem], np.ndarray | None], Any], *, batch_size: int = 256,
                 workers: int | None = None, progress: bool = False, desc: str = "indexing") -> StageTimes:
    """Read, embed and write the images at `positions` in order, the three stages in their own threads."""
    from tqdm.auto import tqdm

    times, stop = StageTimes(items=len(positions)), threading.Event()
    to_embed: queue.Queue = queue.Queue(1)
    to_write: queue.Queue = queue.Queue(1)
    in_flight: set[bytes] = set()
    lock = threading.Lock()

    def put(q: queue.Queue, value: Any) -> None:
        while not stop.is_set():
            try:
                return q.put(value, timeout=0.1)
            except queue.Full:
                pass
        raise _Stop

    def get(q: queue.Queue) -> Any:
        while not stop.is_set():
            try:
                return q.get(timeout=0.1)
            except queue.Empty:
                pass
        raise _Stop

    def dedupe(item: ReadItem) -> None:  # in order: the first of identical images is kept
        with lock:
            seen = item.sha256 in in_flight
        if seen or read.committed(item.sha256):
            item.status, item.pixels, item.thumbnail = "duplicate", None, b""
        else:
            with lock:
                in_flight.add(item.sha256)

    def reading() -> None:
        try:
            batches = ordered_batches(lambda j: read(positions[j]), len(positions), batch_size, workers, prefetch=1)
            with closing(batches):
                for _, items in batches:
                    for item in items:
                        times.read += item.seconds
                        if item.status == "ok":
                            dedupe(item)
                    put(to_embed, items)
            put(to_embed, _DONE)
        except _Stop:
            pass
        except BaseException as exc:  # handed to the writer, which raises it
            put(to_embed, exc)

    def embedding() -> None:
        try:
            while True:
                start = time.perf_counter()
                items = get(to_embed)
                times.embed_wait += time.perf_counter() - start
                if items is _DONE or isinstance(items, BaseException):
                    return put(to_write, items)
                ok = [it for it in items if it.status == "ok"]
                vectors = None
                if ok:
                    start = time.perf_counter()
                    vectors = embed({"pixels": np.stack([it.pixels for it in ok])})["embedding"]
                    times.embed += time.perf_counter() - start
                    for it in ok:
                        it.pixels = None
                put(to_write, (items, vectors))
        except _Stop:
            pass
        except BaseException as exc:
            put(to_write, exc)

    threads = [threading.Thread(target=f, name=f"index-{f.__name__}", daemon=True) for f in (reading, embedding)]
    with tqdm(total=len(positions), desc=desc, unit="img", disable=None if progress else True, smoothing=0.05) as bar:
        for t in threads:
            t.start()
        try:
            while True:
                start = time.perf_counter()
                got = get(to_write)
                times.write_wait += time.perf_counter() - start
                if got is _DONE:
                    break
                if isinstance(got, BaseException):
                    raise got
                items, vectors = got
                start = time.perf_counter()
                write(items, vectors)
                times.write += time.perf_counter() - start
                with lock:
                    in_flight.difference_update(it.sha256 for it in items if it.status == "ok")
                bar.update(len(items))
        finally:
            stop.set()
            for t in threads:
                t.join()
    return times
