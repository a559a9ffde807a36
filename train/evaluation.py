"""Retrieval metrics: Recall@K, NMI and MAP@R, computed in blocks (memory O(block x gallery))."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    from metricsearch.train.data import DataSplit, ImageSet


def _sq_distances(q: Tensor, g: Tensor) -> Tensor:
    """Squared Euclidean distances, block x gallery."""
    return (q * q).sum(1, keepdim=True) + (g * g).sum(1)[None, :] - 2.0 * q @ g.t()


def retrieval_metrics(
    query: np.ndarray | Tensor,
    query_labels: np.ndarray | Tensor,
    gallery: np.ndarray | Tensor | None = None,
    gallery_labels: np.ndarray | Tensor | None = None,
    recall_k: Sequence[int] = (1, 2, 4, 8),
    block_size: int = 1024,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Recall@K and MAP@R of queries against a gallery (the queries themselves when gallery is None).

    Ranking is by Euclidean distance (cosine for L2-normalised embeddings). A query scores in
    Recall@K if one of its K nearest gallery items (itself excluded) shares its label; queries
    with no same-label item in the gallery are left out and not counted in `n_queries`.
    """
    q = torch.as_tensor(np.asarray(query), dtype=torch.float32, device=device)
    ql = torch.as_tensor(np.asarray(query_labels), device=device)
    same_set = gallery is None
    g = q if same_set else torch.as_tensor(np.asarray(gallery), dtype=torch.float32, device=device)
    gl = ql if same_set else torch.as_tensor(np.asarray(gallery_labels), device=device)
    if q.ndim != 2 or g.ndim != 2 or q.shape[1] != g.shape[1]:
        raise ValueError(f"query and gallery embeddings must be 2-D with equal width, got {tuple(q.shape)} and {tuple(g.shape)}")
    if len(ql) != len(q) or len(gl) != len(g):
        raise ValueError("each embedding needs exactly one label")
    ks = sorted({int(k) for k in recall_k if int(k) <= len(g) - int(same_set)})
    if not ks:
        raise ValueError(f"gallery of {len(g)} is too small for Recall@K with K in {list(recall_k)}")
    classes, counts = torch.unique(gl, return_counts=True)
    count_of = dict(zip(classes.tolist(), counts.tolist()))
    r = torch.tensor([count_of.get(int(c), 0) for c in ql.tolist()], device=device) - int(same_set)
    valid = r > 0
    n_top = min(len(g) - int(same_set), max(max(ks), int(r.max().item()) if len(r) else 0))
    hits_at_k = torch.zeros(len(ks), device=device)
    ap_sum = torch.zeros((), device=device)
    for start in range(0, len(q), block_size):
        stop = min(start + block_size, len(q))
        d = _sq_distances(q[start:stop], g)
        if same_set:
            rows = torch.arange(stop - start, device=device)
            d[rows, rows + start] = float("inf")
        nn_idx = d.topk(n_top, dim=1, largest=False).indices
        rel = gl[nn_idx] == ql[start:stop, None]
        keep = valid[start:stop]
        for i, k in enumerate(ks):
            hits_at_k[i] += (rel[:, :k].any(dim=1) & keep).sum()
        rb = r[start:stop].clamp(min=1)
        ranks = torch.arange(1, n_top + 1, device=device)
        within_r = ranks[None, :] <= rb[:, None]
        relf = (rel & within_r).float()
        precision = relf.cumsum(dim=1) / ranks[None, :]
        ap = (precision * relf).sum(dim=1) / rb
        ap_sum += ap[keep].sum()
    n = int(valid.sum().item())
    denom = max(n, 1)
    return {
        "recall_at_k": {int(k): float(h / denom) for k, h in zip(ks, hits_at_k)},
        "map_at_r": float(ap_sum / denom),
        "n_queries": n,
    }


def nmi(embeddings: np.ndarray | Tensor, labels: np.ndarray | Tensor, seed: int = 0) -> float:
    """NMI of k-means clusters (k = number of classes) against the labels, geometric normalisation."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import normalized_mutual_info_score

    x = np.asarray(torch.as_tensor(np.asarray(embeddings)).float().cpu())
    y = np.asarray(labels)
    k = len(np.unique(y))
    if k < 2 or len(x) <= k:
        raise ValueError(f"NMI needs at least 2 classes and more points than classes (got {k} classes, {len(x)} points)")
    clusters = KMeans(n_clusters=k, n_init=3, random_state=seed).fit_predict(x)
    return float(normalized_mutual_info_score(y, clusters, average_method="geometric"))


def evaluate(
    query: np.ndarray,
    query_labels: np.ndarray,
    gallery: np.ndarray | None = None,
    gallery_labels: np.ndarray | None = None,
    recall_k: Sequence[int] = (1, 2, 4, 8),
    with_nmi: bool = True,
    device: str | torch.device = "cpu",
    one_shot_ways: int | None = None,
) -> dict[str, Any]:
    """All metrics as one JSON-ready dict: recall_at_k, nmi (None if skipped), map_at_r, n_queries,
    and `one_shot` (N-way one-shot accuracy, Omniglot style) when `one_shot_ways` is given."""
    out = retrieval_metrics(query, query_labels, gallery, gallery_labels, recall_k, device=device)
    if with_nmi:
        if gallery is None:
            out["nmi"] = nmi(query, query_labels)
        else:
            out["nmi"] = nmi(np.concatenate([query, gallery]), np.concatenate([query_labels, gallery_labels]))
    else:
        out["nmi"] = None
    result = {k: out[k] for k in ("recall_at_k", "nmi", "map_at_r", "n_queries")}
    if one_shot_ways:
        result[f"one_shot_{one_shot_ways}way"] = one_shot_accuracy(query, query_labels, one_shot_ways)
    return result


def one_shot_accuracy(
    embeddings: np.ndarray | Tensor, labels: np.ndarray | Tensor, ways: int = 20, episodes: int = 1000,
    seed: int = 0,
) -> float:
    """N-way one-shot accuracy: per episode, `ways` classes with one support image each; every class
    also gives one other image as a query, which must be nearest to its own class's support image."""
    x = torch.as_tensor(np.asarray(embeddings), dtype=torch.float32)
    y = np.asarray(labels)
    members = [np.flatnonzero(y == c) for c in np.unique(y)]
    members = [m for m in members if len(m) >= 2]
    if len(members) < ways:
        raise ValueError(f"{ways}-way one-shot needs {ways} classes with 2+ images, the set has {len(members)}")
    rng = np.random.default_rng(seed)
    correct = 0
    for _ in range(episodes):
        classes = rng.choice(len(members), size=ways, replace=False)
        pairs = np.stack([rng.choice(members[c], size=2, replace=False) for c in classes])
        d = _sq_distances(x[pairs[:, 1]], x[pairs[:, 0]])
        correct += int((d.argmin(dim=1) == torch.arange(ways)).sum())
    return correct / (episodes * ways)


def evaluate_split(
    embed: Callable[["ImageSet"], np.ndarray],
    split: "DataSplit",
    recall_k: Sequence[int] | None = None,
    with_nmi: bool = True,
    one_shot_ways: int | None = None,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """`evaluate` of an embedding function on a split's test classes: its queries against its
    gallery where it has them (In-Shop), else every test image against the others."""
    recall_k = recall_k or split.recall_k
    if split.query is not None and split.gallery is not None:
        return evaluate(embed(split.query), split.query.labels, embed(split.gallery), split.gallery.labels,
                        recall_k, with_nmi, device)
    return evaluate(embed(split.test), split.test.labels, recall_k=recall_k, with_nmi=with_nmi, device=device,
                    one_shot_ways=one_shot_ways)
