"""`metricsearch index duplicates`: groups of near-duplicate items (resized, re-encoded, cropped or lightly
edited copies) of a gallery: pairs at cosine similarity >= a threshold (faiss range search over the stored
embeddings), joined into connected components, largest group first."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np

from .faiss_index import ivf_lists
from .gallery import Gallery

#: default cosine threshold: edited copies of a photo score above it, distinct photos below (README)
THRESHOLD = 0.95
EXACT_MAX = 50_000  # up to this many vectors the range search is exact (as `index build` picks flat); above, IVF
NPROBE = 8
BLOCK = 16_384  # queries per range search call (bounds the memory of its results)


def components(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Component label (its smallest member) of each of n nodes joined by the edges a[i]-b[i]: vectorised
    hooking onto the smaller root and pointer jumping, no loop over edges."""
    parent = np.arange(n)
    while True:
        ra, rb = parent[a], parent[b]
        if np.array_equal(ra, rb):
            return parent
        low = np.minimum(ra, rb)
        np.minimum.at(parent, ra, low)
        np.minimum.at(parent, rb, low)
        while True:
            jumped = parent[parent]
            if np.array_equal(jumped, parent):
                break
            parent = jumped


def similar_pairs(vectors: np.ndarray, threshold: float = THRESHOLD) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows a, rows b, cosine) of every pair a < b of L2-normalised vectors at cosine >= threshold: exact
    up to EXACT_MAX vectors, IVF (NPROBE lists probed) above."""
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    n, dim = x.shape
    if n > EXACT_MAX:
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, ivf_lists(n), faiss.METRIC_INNER_PRODUCT)
        index.cp.niter = 10  # coarse cells only need to keep near-duplicates together
        index.train(x[np.random.default_rng(0).choice(n, size=min(n, 32 * index.nlist), replace=False)])
        index.nprobe = NPROBE
    else:
        index = faiss.IndexFlatIP(dim)
    index.add(x)
    found_a, found_b, found_s = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.float32)]
    for start in range(0, n, BLOCK):
        lims, scores, rows = index.range_search(x[start:start + BLOCK], float(threshold))
        a = np.repeat(np.arange(start, start + len(lims) - 1), np.diff(lims.astype(np.int64)))
        keep = a < rows
        found_a.append(a[keep])
        found_b.append(rows[keep])
        found_s.append(scores[keep])
    return np.concatenate(found_a), np.concatenate(found_b), np.concatenate(found_s)


def duplicate_groups(vectors: np.ndarray, threshold: float = THRESHOLD) -> list[tuple[np.ndarray, float]]:
    """(rows, lowest cosine of a pair joining them) of each group of 2+ vectors linked by pairs at cosine
    >= threshold, largest group first (then by first row)."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"--threshold must be in (0, 1], got {threshold}")
    a, b, s = similar_pairs(vectors, threshold)
    if not len(a):
        return []
    labels = components(len(vectors), a, b)
    rows = np.unique(np.concatenate([a, b]))
    roots, inverse, sizes = np.unique(labels[rows], return_inverse=True, return_counts=True)
    weakest = np.ones(len(roots))
    np.minimum.at(weakest, np.searchsorted(roots, labels[a]), s)
    order = np.lexsort((roots, -sizes))
    members = np.split(rows[np.argsort(inverse, kind="stable")], np.cumsum(sizes)[:-1])
    return [(members[g], float(weakest[g])) for g in order.tolist()]


def find_duplicates(db: str | Path, threshold: float = THRESHOLD) -> list[dict]:
    """Groups of near-duplicate items of a gallery (its stored, L2-normalised embeddings), largest first:
    {"size", "min_similarity", "items": [{"id", "label", "path"}, ...]} with items in id order."""
    with Gallery.open(db) as gallery:
        catalog = gallery.catalog
        ids, vectors = gallery.vectors(catalog.ids)
    groups = []
    for rows, weakest in duplicate_groups(vectors, threshold):
        items = [{"id": int(ids[r]), "label": catalog.label_of(r), "path": str(catalog.paths[r])}
                 for r in rows.tolist()]
        groups.append({"size": len(items), "min_similarity": round(weakest, 4), "items": items})
    return groups


def draw_duplicates(db: str | Path, groups: list[dict], out: str | Path, most: int = 50) -> Path:
    """duplicates.png in `out`: one row of stored thumbnails per group (the `most` largest), captioned by id."""
    from metricsearch.evaluation.thumbnails import Tile, grid_image

    from .evaluate import stored_image

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with Gallery.open(db) as gallery:
        rows = [[Tile(stored_image(gallery, item["id"]), f"{item['id']} {item['label'] or ''}")
                 for item in group["items"][:12]] for group in groups[:most]]
    titles = [f"group {i + 1}: {g['size']} items, lowest similarity {g['min_similarity']}"
              for i, g in enumerate(groups[:most])]
    grid_image(rows or [[]], row_titles=titles or None).save(out / "duplicates.png")
    return out / "duplicates.png"
