"""A linear projection of an embedding to fewer dimensions (PCA, optionally whitened), fit on images' embeddings and
appended to the exported graph (`metricsearch export --dim D`): 5-10x less memory per gallery item."""

from __future__ import annotations

import json

import numpy as np
import torch
from torch import Tensor, nn

from metricsearch.data import ImageSet
from metricsearch.models.torch_embedder import Embedder


def pca(embeddings: np.ndarray, dim: int, whiten: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The mean (D) and the D x `dim` matrix of the embeddings' `dim` principal directions, largest variance first
    (each divided by its standard deviation when `whiten`); each direction's sign makes its largest entry positive."""
    x = np.asarray(embeddings, dtype=np.float64)
    if not 1 <= dim < x.shape[1]:
        raise ValueError(f"--dim must be between 1 and {x.shape[1] - 1} (the model's dimension is {x.shape[1]}), "
                         f"got {dim}")
    if len(x) <= dim:
        raise ValueError(f"a projection to {dim} dimensions needs more than {dim} images to fit on, got {len(x)}: "
                         "pass more images (--fit-images) or a smaller --dim")
    mean = x.mean(axis=0)
    values, vectors = np.linalg.eigh(np.cov(x - mean, rowvar=False))
    order = np.argsort(values)[::-1][:dim]
    matrix = vectors[:, order]
    matrix *= np.sign(matrix[np.abs(matrix).argmax(axis=0), np.arange(dim)])
    if whiten:
        matrix /= np.sqrt(np.maximum(values[order], values.max() * 1e-6))
    return mean.astype(np.float32), matrix.astype(np.float32)


class Projected(nn.Module):
    """An embedder followed by a fixed projection (x - mean) @ matrix, re-normalised to unit length."""

    def __init__(self, model: Embedder, mean: np.ndarray, matrix: np.ndarray, fit_on: str, whiten: bool) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.from_numpy(np.asarray(mean, np.float32)))
        self.register_buffer("matrix", torch.from_numpy(np.asarray(matrix, np.float32)))
        self.preprocessing, self.normalize = model.preprocessing, True
        self.dim = int(matrix.shape[1])
        self.config = model.config
        #: what the exported file records of the projection (its metadata key `projection`)
        self.description = json.dumps({"dim": self.dim, "from_dim": int(matrix.shape[0]), "whiten": whiten,
                                       "fit_on": fit_on, "method": "pca"}, sort_keys=True)

    def forward(self, x: Tensor) -> Tensor:
        """Unit-length projected embeddings of preprocessed images."""
        return nn.functional.normalize((self.model(x) - self.mean) @ self.matrix, dim=1)


def projected(model: Embedder, images: ImageSet, fit_on: str, dim: int, whiten: bool = False,
              batch_size: int = 64) -> Projected:
    """`model` with a PCA projection to `dim` dimensions appended, fit on the embeddings of `images` (named
    `fit_on` in the exported file's metadata)."""
    mean, matrix = pca(model.eval().embed_set(images, batch_size=batch_size), dim, whiten)
    return Projected(model, mean, matrix, f"{fit_on} ({len(images)} images)", whiten)
