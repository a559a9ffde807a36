"""Within-class whitening of a trained embedding (`model.whiten`): fit on the training images, applied in eval mode."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from metricsearch.data import ImageSet
from metricsearch.models.torch_embedder import Embedder, build_embedder

#: test-time views: shifts (dx, dy) in pixels and rotations in degrees (Embedder.set_views)
Views = tuple[Sequence[Sequence[int]], Sequence[float]]


def whitening_matrix(embeddings: np.ndarray, labels: np.ndarray, power: float) -> np.ndarray:
    """The within-class scatter of the embeddings (each minus its class mean) raised to -`power`."""
    x = np.asarray(embeddings, dtype=np.float64)
    classes, index = np.unique(labels, return_inverse=True)
    sums = np.zeros((len(classes), x.shape[1]))
    np.add.at(sums, index, x)
    residuals = x - (sums / np.bincount(index)[:, None])[index]
    scatter = residuals.T @ residuals / len(x)
    values, vectors = np.linalg.eigh(scatter)
    values = np.maximum(values, values.max() * 1e-6)  # a direction no image varies in is not blown up
    return (vectors * values ** -power) @ vectors.T


def own_embeddings(model: Embedder, images: ImageSet, batch_size: int = 64,
                   views: Views | None = None) -> np.ndarray:
    """Each image's own embedding with the model's test-time shifts and rotations (or these `views`: shifts,
    rotations), without its whitening or symmetric copies (N x part_dim); the model is left as it was."""
    whitening = model.whitening.clone() if model.whiten else None
    shifts, rotations, symmetries = model.tta_shifts, model.tta_rotations, model.tta_symmetries
    try:
        if whitening is not None:
            model.set_whitening(torch.eye(model.part_dim))
        model.set_views(*(views or (shifts, rotations)))
        return model.embed_set(images, batch_size=batch_size)
    finally:
        model.set_views(shifts, rotations, symmetries)
        if whitening is not None:
            model.set_whitening(whitening)


def fit_whitening(model: Embedder, images: ImageSet, batch_size: int = 64) -> None:
    """Fit the whitening of a model built with `whiten` on these images and their classes, and set it.
    `batch_size` images (each with its test views) are embedded at once: 64 keeps the memory of a training batch."""
    if not model.whiten:
        raise ValueError("fit_whitening needs a model built with whiten > 0 (model.whiten)")
    # fit on the images' own embeddings: every symmetric copy shares the matrix
    embeddings = own_embeddings(model, images, batch_size)
    matrix = whitening_matrix(embeddings, np.asarray(images.labels), model.whiten)
    model.set_whitening(torch.from_numpy(matrix).float())


def change_views(model: Embedder, images: Callable[[], ImageSet] | None, shifts: Sequence[Sequence[int]] | None = None,
                 rotations: Sequence[float] | None = None, symmetries: Sequence[str] | None = None) -> None:
    """Give `model` these test-time views (None: keep its own); a whitened model's matrix is fit again on `images()`,
    its training images (asked for only then), when the shifts or rotations change (its copies share the matrix)."""
    before = (model.tta_shifts, model.tta_rotations)
    model.set_views(model.tta_shifts if shifts is None else shifts, model.tta_rotations if rotations is None
                    else rotations, model.tta_symmetries if symmetries is None else symmetries)
    if model.whiten and (model.tta_shifts, model.tta_rotations) != before:
        if images is None:
            raise ValueError("other test-time shifts or rotations need the whitening fit again on the training "
                             "images: export the run directory or checkpoint, not a model in memory")
        fit_whitening(model, images())


def whitened(model: Embedder, images: ImageSet, power: float, batch_size: int = 64) -> Embedder:
    """A copy of `model` (in eval mode) with `whiten` = `power`, fit on these images and their classes."""
    copy = build_embedder({**model.config, "whiten": power})
    missing, unexpected = copy.load_state_dict(model.state_dict(), strict=False)
    if set(missing) - {"whitening"} or unexpected:
        raise ValueError(f"the model's weights do not fit its config: missing {missing}, unexpected {unexpected}")
    fit_whitening(copy.to(next(model.parameters()).device).eval(), images, batch_size)
    return copy
