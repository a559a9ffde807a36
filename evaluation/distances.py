"""Embeddings as 2-D float32 arrays, their squared Euclidean distances, and the centring (less a share of the mean
gallery embedding, L2-normalised again) that retrieval metrics and one-shot episodes apply before comparing."""

from __future__ import annotations

from typing import Any

import numpy as np


def as_2d(x: Any, what: str) -> np.ndarray:
    """`x` as a float32 array, a ValueError naming `what` unless it is 2-D (items x dim)."""
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim != 2:
        raise ValueError(f"{what} embeddings must be 2-D (items x dim), got shape {arr.shape}")
    return arr


def sq_distances(q: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances, len(q) x len(g), float32."""
    return (q * q).sum(1, keepdims=True) + (g * g).sum(1)[None, :] - 2.0 * (q @ g.T)


def normalized(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), float32."""
    v = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return np.ascontiguousarray(v / np.where(norms > 0, norms, 1.0), dtype=np.float32)


def check_center(center: float, gallery: bool = True, episodes: bool = False) -> None:
    """A ValueError unless `center` (the fraction of the mean gallery embedding taken off) lies in [0, 1] and, when
    it is set, there is a gallery or there are one-shot episodes to centre."""
    if not 0.0 <= center <= 1.0:
        raise ValueError(f"center is the fraction of the mean gallery embedding taken off: pass 0 to 1, not {center}")
    if center and not (gallery or episodes):
        raise ValueError("center needs a gallery (query and gallery images) or one-shot episodes: pass "
                         "one_shot_ways and one_shot_protocol too (--one-shot-ways, --one-shot-protocol)")


def centred(query: np.ndarray, gallery: np.ndarray, center: float) -> tuple[np.ndarray, np.ndarray]:
    """(query, gallery) less `center` times the mean gallery embedding, L2-normalised; unchanged for 0."""
    if center == 0.0:
        return query, gallery
    mean = center * gallery.mean(axis=0)
    return normalized(query - mean), normalized(gallery - mean)
