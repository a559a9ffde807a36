"""The search page's event handlers: plain methods over one open gallery, testable without a server.

Each handler takes what a Gradio component sends (an upload, the image editor's value, a number,
a label) and returns what the output components show. A query file is read only if it is a regular
file in the page's upload folder; it is decoded as the indexer decodes gallery images, checked against
the gallery's limits (pixels, smallest side) and resized to the model's input at once, so that only
that small image waits for a shared inference call; large images are decoded a few at a time across
requests. Thumbnails are the bytes in the gallery's LMDB, written once each into the upload folder: no
image's source path is ever served.
"""

from __future__ import annotations

import io
import shutil
import tempfile
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import gradio as gr
from gradio.utils import get_upload_folder
import numpy as np
from PIL import Image

from metricsearch.app.web.batching import Coalescer
from metricsearch.app.web.uploads import uploaded_file
from metricsearch.data import UnreadableImageError, pixel_count
from metricsearch.evaluation.report import class_table, rank, worst_queries
from metricsearch.index import Gallery, ReadSettings, labelled_items
from metricsearch.index.pipeline import decode as read_image

#: the largest query accepted, in pixels (a 25-megapixel photo; larger uploads are refused)
DEFAULT_QUERY_MAX_PIXELS = 25_000_000
#: a query over this many pixels is large: its full-size decode waits while FULL_SIZE_DECODES others run
LARGE_QUERY_PIXELS = 4_000_000
#: large queries decoded at once, across all requests (each is resized to the model's input before the next)
FULL_SIZE_DECODES = 2
#: the one answer to a query file that was not uploaded to this page, whatever is at its path
NOT_UPLOADED = "Cannot search with this file: only an image uploaded to this page can be searched."
#: the label filter's value meaning "every label"
ALL_LABELS = ""
#: labelled items that the Evaluate tab ranks at most (a random sample of larger galleries)
EVALUATE_ITEMS = 10_000
#: the Evaluate tab's class table: its columns (evaluation.report's class rows)
CLASS_COLUMNS = ("label", "queries", "recall_at_1", "map_at_r", "most_confused_with")

#: what the "about this gallery" panel shows of `gallery.info()`, in order (server paths stay out)
ABOUT = {"model": "model", "dim": "dimension", "count": "items", "labels": "labels", "index_type": "index type",
         "search_params": "search setting", "tuning": "measured recall", "index_reason": "why this index",
         "index_candidates": "candidates (* chosen)", "device": "device"}


@lru_cache(maxsize=1)
def _placeholder() -> bytes:
    """A grey square, for galleries built without thumbnails."""
    out = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 200, 200)).save(out, "PNG")
    return out.getvalue()


@dataclass(frozen=True)
class Query:
    """One decoded query: its image resized to the model's input, how many neighbours, and an optional label to keep."""

    image: Image.Image
    k: int
    label: str | None


def _field(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, Mapping) else getattr(value, key, None)


def _file_of(value: Any) -> tuple[str | None, str]:
    """(path, name to show) of what an Image or ImageEditor component sent, unprocessed."""
    if isinstance(value, (str, Path)):
        return str(value), Path(value).name
    if _field(value, "layers") is not None:  # the image editor: search its composite (the crop)
        value = _field(value, "composite")
    path = _field(value, "path")
    return (str(path) if path else None), _field(value, "orig_name") or "upload"


class SearchHandlers:
    """The page's handlers over an open gallery (`search`, `thumbnail`, `info`, `labels`)."""

    def __init__(self, gallery: Gallery, *, max_pixels: int = DEFAULT_QUERY_MAX_PIXELS, max_k: int = 50,
                 max_batch: int = 32, uploads: str | Path | None = None) -> None:
        self.gallery = gallery
        settings = gallery.settings
        #: queries over the gallery's own pixel limit, or with a side under its minimum, are refused here
        self.max_pixels = min(max_pixels, settings.get("max_pixels") or max_pixels)
        self.min_side = int(settings.get("min_side") or 1)
        self.max_k = max_k
        self.labels = [str(label) for label in gallery.labels()]
        self._search = Coalescer(self._search_batch, max_batch)
        #: how queries are read: the indexer's decoding (a JPEG at a reduced scale) within the page's limits
        self._read = ReadSettings(**{**settings, "mode": None, "max_pixels": self.max_pixels,
                                     "min_side": self.min_side})
        self._full_size = threading.BoundedSemaphore(FULL_SIZE_DECODES)
        #: the only folder query files are read from (default: Gradio's upload folder, which `serve` makes its own)
        self.uploads = Path(uploads or get_upload_folder())
        self.uploads.mkdir(parents=True, exist_ok=True)  # Gradio makes it on the first upload; a fresh machine has none
        self.uploads = self.uploads.resolve()
        #: where thumbnails are written, once each, from the LMDB: in the upload folder, which Gradio
        #: serves anyway (a PIL image would be re-encoded and hashed on every answer instead)
        self.thumbnail_dir = Path(tempfile.mkdtemp(prefix="metricsearch-thumbnails-", dir=self.uploads))
        self._thumbnails: dict[int, Path] = {}
        self._evaluation: tuple[Image.Image, list[list[Any]]] | None = None
        self._evaluation_lock = threading.Lock()

    # -- the work ------------------------------------------------------------------------------

    def _search_batch(self, queries: list[Query]) -> list[list[Any]]:
        """Hits of several queries: one embedding call for all, one index search per label filter."""
        images = np.stack([np.asarray(q.image) for q in queries])
        vectors = self.gallery.embed_pixels(self.gallery.embedder.preprocessing.normalized_batch(images))
        by_label: dict[str | None, list[int]] = defaultdict(list)
        for i, q in enumerate(queries):
            by_label[q.label].append(i)
        out: list[list[Any]] = [[] for _ in queries]
        for label, rows in by_label.items():
            k = max(queries[i].k for i in rows)
            for i, hits in zip(rows, self.gallery.search(vectors[rows], k, label=label)):
                out[i] = list(hits)[:queries[i].k]
        return out

    def thumbnail(self, item_id: int) -> Path:
        """The file of an item's thumbnail, written from the gallery's LMDB the first time it is asked for."""
        path = self._thumbnails.get(item_id)
        if path is None or not path.is_file():  # new, or cleared by Gradio's cache expiry
            data = self.gallery.thumbnail(item_id) or _placeholder()
            path = self.thumbnail_dir / f"{item_id}.{Image.open(io.BytesIO(data)).format.lower()}"
            staging = path.with_name(f".{path.name}.{threading.get_ident()}")
            staging.write_bytes(data)
            staging.replace(path)
            self._thumbnails[item_id] = path
        return path

    def decode(self, value: Any, name: str = "query image") -> Image.Image:
        """The query image a component sent (path, FileData, editor value, PIL image, or the bytes of a
        file named `name` sent to the JSON API), resized to the model's input, or gr.Error saying why not.

        A path is read only if it is a regular file in the upload folder (`NOT_UPLOADED` otherwise,
        before anything is opened); the image must fit the gallery's limits, so that it cannot fail
        the inference call that it shares with other queries. It is decoded as the indexer decodes
        gallery images and resized at once (the same pixels as `Gallery.embed` would embed); one over
        LARGE_QUERY_PIXELS waits while FULL_SIZE_DECODES others are decoded, whatever request they belong to."""
        path, name = (None, name) if isinstance(value, (Image.Image, bytes)) else _file_of(value)
        if path:
            value = uploaded_file(path, self.uploads)
            if value is None:
                raise gr.Error(NOT_UPLOADED, print_exception=False)
        elif not isinstance(value, (Image.Image, bytes)):
            raise gr.Error("No image to search: upload, paste or take a webcam shot (a file that the query box "
                           "cannot show is not an image it can read).", print_exception=False)
        preprocessing = self.gallery.embedder.preprocessing
        try:
            with self._full_size if pixel_count(value) > LARGE_QUERY_PIXELS else nullcontext():
                return preprocessing.resized(read_image(value, self._read, preprocessing, name))
        except UnreadableImageError as exc:
            raise gr.Error(f"Cannot search with this file. {exc}", print_exception=False) from None

    def query(self, value: Any, k: Any = 10, label: Any = ALL_LABELS, name: str = "query image") -> Query:
        """A checked query from raw component values (`name`: the file's name, for bytes)."""
        try:
            k = int(k)
        except (TypeError, ValueError):
            raise gr.Error(f"k must be a whole number, got {k!r}", print_exception=False) from None
        if not 1 <= k <= self.max_k:
            raise gr.Error(f"k must be between 1 and {self.max_k}, got {k}", print_exception=False)
        label = None if label in (None, ALL_LABELS) else str(label)
        if label is not None and label not in self.labels:
            raise gr.Error(f"no label {label!r} in this gallery", print_exception=False)
        return Query(self.decode(value, name), k, label)

    def hits(self, queries: Sequence[Query]) -> list[list[dict[str, Any]]]:
        """The hits (id, score, label) of checked queries, nearest first: they share inference calls with
        every other query arriving meanwhile, the page's included."""
        return [[{"id": int(h.id), "score": round(float(h.score), 4), "label": h.label} for h in hits]
                for hits in self._search.map(list(queries))]

    def results(self, hits: Sequence[dict[str, Any]]) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
        """The results gallery (thumbnail, caption) of some hits (id, score, label), and those hits."""
        thumbs = [(str(self.thumbnail(row["id"])), f"{row['label'] or '-'} · {row['score']:.3f} · #{row['id']}")
                  for row in hits]
        return thumbs, list(hits)

    def public_info(self) -> dict[str, Any]:
        """What the gallery tells about itself that a visitor may see (no server path: the model's file name)."""
        info = dict(self.gallery.info())
        if info.get("model"):
            info["model"] = Path(str(info["model"])).name
        return {key: info[key] for key in ABOUT if info.get(key) is not None}

    # -- the handlers --------------------------------------------------------------------------

    def search(self, image: Any, k: Any = 10, label: Any = ALL_LABELS):
        """The `/search` endpoint and the Search button: thumbnails with captions, and the hits as JSON."""
        return self.results(self.hits([self.query(image, k, label)])[0])

    def search_id(self, hits: list[dict[str, Any]] | None, k: Any, label: Any, evt: gr.SelectData):
        """A click on a result: that result's thumbnail becomes the query, and is searched."""
        if not hits or evt.index is None or not 0 <= int(evt.index) < len(hits):
            raise gr.Error("That result is gone: search again.", print_exception=False)
        path = str(self.thumbnail(int(hits[int(evt.index)]["id"])))
        return (path, *self.search(path, k, label))

    def evaluation(self) -> tuple[Image.Image, list[list[Any]]]:
        """The Evaluate tab (computed once): the worst queries of the served gallery, each labelled item
        querying the others, and the per-class table (`CLASS_COLUMNS`), worst Recall@1 first."""
        with self._evaluation_lock:
            if self._evaluation is None:
                items, names = labelled_items(self.gallery, EVALUATE_ITEMS)
                try:
                    ranking = rank(items)
                except ValueError as exc:
                    raise gr.Error(f"Cannot evaluate this gallery: {exc}.", print_exception=False) from None
                classes, _ = class_table(ranking, items.labels, items.labels, names)
                self._evaluation = (worst_queries(ranking, items, items, names),
                                    [[row[c] for c in CLASS_COLUMNS] for row in classes])
        return self._evaluation

    def about(self) -> str:
        """The "about this gallery" panel: model, dimension, items, index type and its setting, device."""
        info = self.public_info()
        exact = self.gallery.info().get("exact")
        if not info.get("search_params") and exact:
            info["search_params"] = "exact search"
        tuning = info.get("tuning") or {}
        if exact:
            info["tuning"] = "exact search (nothing to measure)"
        elif "recall_at_10" in tuning:
            info["tuning"] = f"recall@10 {tuning['recall_at_10']} (target {tuning.get('target', '-')})"
        rows = []
        for key, name in ABOUT.items():
            value = info.get(key)
            if isinstance(value, Mapping):
                value = ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
            if isinstance(value, list):
                value = "; ".join(value) or None
            if value is not None:
                rows.append(f"- **{name}**: `{value}`")
        return "\n".join(rows)

    def close(self) -> None:
        """Delete the thumbnail files (the gallery stays open)."""
        shutil.rmtree(self.thumbnail_dir, ignore_errors=True)
