"""The raw-pixel reference embedder: resized pixels, flattened, as the baseline every number is compared to."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from PIL import Image

from metricsearch.data import ImageSet
from metricsearch.models.batches import embed_image_set
from metricsearch.models.preprocessing import Preprocessing


class PixelEmbedder:
    """Embeds an image as its resized pixels in [0, 1], flattened (Euclidean ranking)."""

    def __init__(self, size: int = 28, channels: int = 1) -> None:
        self.preprocessing = Preprocessing(size=size, channels=channels, mean=(0.0,) * channels, std=(1.0,) * channels)
        self.dim = size * size * channels

    def embed_arrays(self, batch: np.ndarray) -> np.ndarray:
        """Flattened preprocessed arrays."""
        return np.asarray(batch, dtype=np.float32).reshape(len(batch), -1)

    def embed_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        """Flattened resized pixels of PIL images."""
        return self.embed_arrays(self.preprocessing.batch(list(images)))

    def embed_set(self, images: ImageSet, batch_size: int = 256, progress: bool = False,
                  workers: int | None = None) -> np.ndarray:
        """Flattened resized pixels of a whole ImageSet."""
        return embed_image_set(self.embed_arrays, images, self.preprocessing, batch_size, workers, progress)
