"""`metricsearch evaluate --db DIR`: Recall@K, MAP@R and NMI of a labelled gallery through its own
faiss index, each item querying the rest; for an approximate index also recall@10 against exact."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Sequence

import faiss
import numpy as np
from PIL import Image

from metricsearch.data.base import RECALL_K_SMALL
from metricsearch.evaluation import nmi, ranked_metrics

from .faiss_index import recall_without_self
from .gallery import Gallery

EXACT_SAMPLE = 10_000  # queries checked against exact search for an approximate index


def evaluate_gallery(db: str | Path, recall_k: Sequence[int] | None = None, with_nmi: bool = True,
                     block_size: int = 1024, device: str = "auto", report: str | Path | None = None) -> dict[str, Any]:
    """recall_at_k, nmi, map_at_r, n_queries (the keys of every evaluate mode) of the gallery's labelled
    items searching the gallery through its index, themselves left out; plus recall_at_10_vs_exact
    for an approximate index; with `report`, also the report of where it fails (evaluation.report,
    exact neighbours, stored thumbnails) in that folder."""
    with Gallery.open(db, device=device) as gallery:
        catalog = gallery.catalog
        ids, vectors = gallery.vectors(catalog.ids)
        codes = catalog.codes
        labelled = np.flatnonzero(codes >= 0)
        if len(np.unique(codes[labelled])) < 2:
            raise ValueError(f"{db}: evaluating needs items of at least 2 labels (the gallery has "
                             f"{len(np.unique(codes[labelled]))}); index a labelled spec such as folder:PATH")
        ks = sorted({int(k) for k in (recall_k or RECALL_K_SMALL) if int(k) <= len(ids) - 1})
        if not ks:
            raise ValueError(f"a gallery of {len(ids)} items is too small for Recall@K with K in "
                             f"{list(recall_k or RECALL_K_SMALL)}")
        label_counts = np.bincount(codes[labelled])
        r = label_counts[codes[labelled]] - 1
        n_top = min(len(ids) - 1, max(max(ks), int(r.max())))
        relevant = np.zeros((len(labelled), n_top), dtype=bool)
        found_ids = np.full((len(labelled), n_top), -1, dtype=np.int64)
        for start in range(0, len(labelled), block_size):
            rows = labelled[start:start + block_size]
            for j, (row, hits) in enumerate(zip(rows, gallery.search(vectors[rows], n_top + 1)), start=start):
                others = hits.rows[hits.rows != row][:n_top]
                relevant[j, :len(others)] = codes[others] == codes[row]
                found_ids[j, :len(others)] = ids[others]
        result = ranked_metrics(relevant, r, ks)
        result["nmi"] = nmi(vectors[labelled], codes[labelled]) if with_nmi else None
        result = {k: result[k] for k in ("recall_at_k", "nmi", "map_at_r", "n_queries")}
        if not gallery.exact:
            sample = labelled[:EXACT_SAMPLE]
            _, exact = faiss.knn(np.ascontiguousarray(vectors[sample]), vectors, 11, metric=faiss.METRIC_INNER_PRODUCT)
            result["recall_at_10_vs_exact"] = round(recall_without_self(
                found_ids[:len(sample), :10], ids[exact], ids[sample], 10), 4)
        if report is not None:
            from metricsearch.evaluation.report import write_report

            write_report(report, result, catalog.names, _report_set(gallery, ids[labelled], vectors[labelled],
                                                                    codes[labelled]))
        return result


def _report_set(gallery: Gallery, ids: np.ndarray, vectors: np.ndarray, codes: np.ndarray):
    """The evaluation.report view of some items: their vectors, label codes and stored images."""
    from metricsearch.evaluation.report import ReportSet

    return ReportSet(vectors, codes, lambda i: stored_image(gallery, int(ids[i])))


def labelled_items(gallery: Gallery, most: int | None = None, seed: int = 0):
    """(ReportSet of the gallery's labelled items, or of `most` of them drawn at random; the label names)."""
    catalog = gallery.catalog
    labelled = np.flatnonzero(catalog.codes >= 0)
    if most is not None and len(labelled) > most:
        labelled = np.sort(np.random.default_rng(seed).choice(labelled, most, replace=False))
    ids, vectors = gallery.vectors(catalog.ids[labelled])
    return _report_set(gallery, ids, vectors, catalog.codes[labelled]), list(catalog.names)


def stored_image(gallery: Gallery, item_id: int) -> Image.Image:
    """An item's stored thumbnail, else its source file, else a grey square (the file has gone)."""
    data = gallery.thumbnail(item_id)
    try:
        return Image.open(io.BytesIO(data) if data else gallery.item(item_id)["path"])
    except OSError:
        return Image.new("RGB", (32, 32), (128, 128, 128))
