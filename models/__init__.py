"""Embedding networks and the embedders used at run time, with the preprocessing they expect.

Importing this package does not import torch: the serving side uses `OnnxEmbedder` and
`PixelEmbedder` alone. The torch networks live in `metricsearch.models.torch_embedder` and
`metricsearch.models.backbones` (the `train` extra).
"""

from __future__ import annotations

from metricsearch.models.base import ArrayEmbedder
from metricsearch.models.image_set_embedding import embed_image_set, ordered_batches, preprocessed_batches
from metricsearch.models.onnx_embedder import OnnxEmbedder, select_providers
from metricsearch.models.pixels import PixelEmbedder
from metricsearch.models.preprocessing import Preprocessing

__all__ = ["ArrayEmbedder", "OnnxEmbedder", "PixelEmbedder", "Preprocessing", "embed_image_set", "open_embedder",
           "ordered_batches", "preprocessed_batches", "select_providers"]


def open_embedder(model: str, device: str = "auto", pixels_size: int = 28,
                  pixels_channels: int = 1, *, memory: int | None = None) -> OnnxEmbedder | PixelEmbedder:
    """The run-time embedder a name gives: an exported .onnx file, or `pixels` for the raw-pixel baseline.
    `memory`: a batch job's budget of peak resident bytes (`ArrayEmbedder.memory`), with onnxruntime's memory
    arena off (see OnnxEmbedder); None: a server's embedder (the arena on)."""
    embedder = (PixelEmbedder(pixels_size, pixels_channels) if model == "pixels"
                else OnnxEmbedder(model, device=device, arena=memory is None))
    if memory is not None:
        embedder.memory = memory
    return embedder
