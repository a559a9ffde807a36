"""The raw-pixel reference embedder: resized pixels, flattened, as the baseline every number is compared to."""

from __future__ import annotations

import numpy as np

from metricsearch.models.base import ArrayEmbedder
from metricsearch.models.preprocessing import Preprocessing


class PixelEmbedder(ArrayEmbedder):
    """Embeds an image as its resized pixels in [0, 1], flattened (Euclidean ranking)."""

    def __init__(self, size: int = 28, channels: int = 1) -> None:
        self.preprocessing = Preprocessing(size=size, channels=channels, mean=(0.0,) * channels, std=(1.0,) * channels)
        self.dim = size * size * channels

    def embed_arrays(self, batch: np.ndarray) -> np.ndarray:
        """Flattened preprocessed arrays."""
        return np.asarray(batch, dtype=np.float32).reshape(len(batch), -1)
