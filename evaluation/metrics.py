"""Retrieval metrics: Recall@K, MAP@R and NMI in numpy, computed in blocks (memory O(block x gallery))."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import numpy as np

from metricsearch.data.base import RECALL_K
from metricsearch.evaluation.distances import as_2d, centred, check_center, normalized as _normalized, sq_distances
from metricsearch.evaluation.oneshot import one_shot_accuracy, one_shot_error


def nearest(d: np.ndarray, n: int) -> np.ndarray:
    """Column indices of the n smallest entries of each row of `d`, nearest first (ties by index)."""
    if n < d.shape[1]:
        part = np.sort(np.argpartition(d, n - 1, axis=1)[:, :n], axis=1)
    else:
        part = np.broadcast_to(np.arange(d.shape[1]), d.shape)
    order = np.argsort(np.take_along_axis(d, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def retrieval_metrics(
    query: np.ndarray,
    query_labels: np.ndarray,
    gallery: np.ndarray | None = None,
    gallery_labels: np.ndarray | None = None,
    recall_k: Sequence[int] = RECALL_K,
    block_size: int = 1024,
) -> dict[str, Any]:
    """Recall@K and MAP@R of queries against a gallery (the queries themselves when gallery is None).

    Ranking is by Euclidean distance (cosine for L2-normalised embeddings). A query scores in
    Recall@K if one of its K nearest gallery items (itself excluded) shares its label; queries
    with no same-label item in the gallery are left out and not counted in `n_queries`.
    """
    q, ql = as_2d(query, "query"), np.asarray(query_labels)
    same_set = gallery is None
    g = q if same_set else as_2d(gallery, "gallery")
    gl = ql if same_set else np.asarray(gallery_labels)
    if q.shape[1] != g.shape[1]:
        raise ValueError(f"query and gallery embeddings must have equal width, got {q.shape} and {g.shape}")
    if len(ql) != len(q) or len(gl) != len(g):
        raise ValueError("each embedding needs exactly one label")
    ks = sorted({int(k) for k in recall_k if int(k) <= len(g) - int(same_set)})
    if not ks:
        raise ValueError(f"gallery of {len(g)} is too small for Recall@K with K in {list(recall_k)}")
    classes, counts = np.unique(gl, return_counts=True)
    pos = np.clip(np.searchsorted(classes, ql), 0, len(classes) - 1)
    r = np.where(classes[pos] == ql, counts[pos], 0) - int(same_set)
    n_top = min(len(g) - int(same_set), max(max(ks), int(r.max()) if len(r) else 0))
    hits_at_k, ap_sum = np.zeros(len(ks)), 0.0
    for start in range(0, len(q), block_size):
        stop = min(start + block_size, len(q))
        d = sq_distances(q[start:stop], g)
        if same_set:
            rows = np.arange(stop - start)
            d[rows, rows + start] = np.inf
        hits, ap = _ranked_sums(gl[nearest(d, n_top)] == ql[start:stop, None], r[start:stop], ks)
        hits_at_k, ap_sum = hits_at_k + hits, ap_sum + ap
    return _summary(ks, hits_at_k, ap_sum, int((r > 0).sum()))


def _ranked_sums(relevant: np.ndarray, r: np.ndarray, ks: Sequence[int]) -> tuple[np.ndarray, float]:
    """Per K the queries with a relevant item among their first K, and the sum of AP@R, over the
    queries (rows of `relevant`) that have R = r > 0 relevant items."""
    keep = r > 0
    hits = np.array([(relevant[:, :k].any(axis=1) & keep).sum() for k in ks], dtype=np.float64)
    return hits, float(average_precision_at_r(relevant, r)[keep].sum())


def average_precision_at_r(relevant: np.ndarray, r: np.ndarray) -> np.ndarray:
    """AP@R of each query (row of `relevant`, ranked neighbours) with R = r relevant items (0 where r = 0)."""
    ranks = np.arange(1, relevant.shape[1] + 1)
    rb = np.maximum(r, 1)
    relf = (relevant & (ranks[None, :] <= rb[:, None])).astype(np.float64)
    return (relf.cumsum(axis=1) / ranks[None, :] * relf).sum(axis=1) / rb


def _summary(ks: Sequence[int], hits_at_k: np.ndarray, ap_sum: float, n: int) -> dict[str, Any]:
    denom = max(n, 1)
    return {"recall_at_k": {k: float(h / denom) for k, h in zip(ks, hits_at_k)}, "map_at_r": float(ap_sum / denom),
            "n_queries": n}


def ranked_metrics(relevant: np.ndarray, n_relevant: np.ndarray, recall_k: Sequence[int]) -> dict[str, Any]:
    """Recall@K and MAP@R from ranked search results: relevant[i, j] says whether query i's (j+1)-th
    neighbour (itself excluded) shares its label, n_relevant[i] is how many items do (R). Queries
    with R = 0 are left out, as in `retrieval_metrics`."""
    relevant, r = np.asarray(relevant, dtype=bool), np.asarray(n_relevant)
    ks = sorted({int(k) for k in recall_k})
    hits, ap = _ranked_sums(relevant, r, ks)
    return _summary(ks, hits, ap, int((r > 0).sum()))


def nmi_score(labels: np.ndarray, clusters: np.ndarray) -> float:
    """Normalised mutual information of two labellings, geometric normalisation (as scikit-learn's)."""
    _, y = np.unique(np.asarray(labels), return_inverse=True)
    _, c = np.unique(np.asarray(clusters), return_inverse=True)
    joint = np.zeros((y.max() + 1, c.max() + 1))
    np.add.at(joint, (y, c), 1.0)
    joint /= len(y)
    py, pc = joint.sum(1), joint.sum(0)
    nz = joint > 0
    mi = float((joint[nz] * np.log(joint[nz] / np.outer(py, pc)[nz])).sum())
    hy, hc = (float(-(p[p > 0] * np.log(p[p > 0])).sum()) for p in (py, pc))
    if hy == 0.0 or hc == 0.0:
        return 1.0 if hy == hc else 0.0
    return max(0.0, mi) / np.sqrt(hy * hc)


def nmi(embeddings: np.ndarray, labels: np.ndarray, seed: int = 0) -> float:
    """NMI of k-means clusters (faiss, k = number of classes, best of 3) against the labels."""
    import faiss

    x = np.ascontiguousarray(as_2d(embeddings, "NMI"))
    y = np.asarray(labels)
    k = len(np.unique(y))
    if k < 2 or len(x) <= k:
        raise ValueError("NMI needs at least 2 classes and more points than classes "
                         f"(got {k} classes, {len(x)} points)")
    kmeans = faiss.Kmeans(x.shape[1], k, niter=25, nredo=3, seed=seed, min_points_per_centroid=1,
                          max_points_per_centroid=max(256, len(x)), verbose=False)
    kmeans.train(x)
    _, clusters = kmeans.index.search(x, 1)
    return nmi_score(y, clusters[:, 0])


def evaluate(
    query: np.ndarray,
    query_labels: np.ndarray,
    gallery: np.ndarray | None = None,
    gallery_labels: np.ndarray | None = None,
    recall_k: Sequence[int] = RECALL_K,
    with_nmi: bool = True,
    one_shot_ways: int | None = None,
    one_shot_protocol: str | None = None,
    groups: np.ndarray | None = None,
    sources: np.ndarray | None = None,
    one_shot_episodes: int = 1000,
    center: float = 0.0,
) -> dict[str, Any]:
    """All metrics as one dict: recall_at_k ({K: value}), nmi (None if skipped), map_at_r, n_queries,
    and when `one_shot_ways` is given: `one_shot_<N>way` (N-way one-shot accuracy over across-alphabet
    episodes, Omniglot style) without a protocol, or with `one_shot_protocol` (see evaluation.oneshot)
    `one_shot_<N>way_<protocol>`: {error, ci95: [low, high], episodes} over the queries' images, using
    their `groups` (alphabets) and `sources` (drawers). With `center`, `center` times the mean gallery embedding
    (in one-shot episodes: of the support images) is taken from query and gallery embeddings, compared by cosine;
    the result then says so (`center`)."""
    check_center(center, gallery is not None, bool(one_shot_ways and one_shot_protocol))
    if gallery is not None:
        query, gallery = centred(query, gallery, center)
    result = retrieval_metrics(query, query_labels, gallery, gallery_labels, recall_k)
    if not with_nmi:
        result["nmi"] = None
    elif gallery is None:
        result["nmi"] = nmi(query, query_labels)
    else:
        result["nmi"] = nmi(np.concatenate([query, gallery]), np.concatenate([query_labels, gallery_labels]))
    result = {k: result[k] for k in ("recall_at_k", "nmi", "map_at_r", "n_queries")}
    if center and gallery is not None:
        result["center"] = center
    if one_shot_ways and one_shot_protocol:
        error, low, high = one_shot_error(query, query_labels, groups, sources, one_shot_ways, one_shot_protocol,
                                          one_shot_episodes, center=center)
        result[f"one_shot_{one_shot_ways}way_{one_shot_protocol}"] = {
            "error": error, "ci95": [low, high], "episodes": one_shot_episodes,
            **({"center": center} if center else {})}
    elif one_shot_ways:
        result[f"one_shot_{one_shot_ways}way"] = one_shot_accuracy(query, query_labels, one_shot_ways)
    return result


def __getattr__(name: str) -> Callable:
    """`normalized`, moved to `metricsearch.evaluation.distances`: a deprecated alias here until 0.2."""
    if name != "normalized":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn("metricsearch.evaluation.metrics.normalized is deprecated and goes in 0.2: import it from "
                  "metricsearch.evaluation.distances", DeprecationWarning, stacklevel=2)
    return _normalized
