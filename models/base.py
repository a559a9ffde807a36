"""The base of every embedder: PIL images and whole ImageSets embedded through the one `embed_arrays`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import numpy as np
from PIL import Image

from metricsearch.data import ImageSet
from metricsearch.models.batches import embed_image_set
from metricsearch.models.preprocessing import Preprocessing


class ArrayEmbedder(ABC):
    """An embedder of preprocessed arrays (`embed_arrays`), with the `preprocessing` its inputs need."""

    preprocessing: Preprocessing

    @abstractmethod
    def embed_arrays(self, batch: np.ndarray) -> np.ndarray:
        """Embeddings (N x dim float32) of preprocessed images (N x C x H x W float32)."""

    def embed_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        """Embeddings of PIL images, preprocessed as the embedder expects."""
        return self.embed_arrays(self.preprocessing.batch(list(images)))

    def embed_set(self, images: ImageSet, batch_size: int = 256, progress: bool = False,
                  workers: int | None = None) -> np.ndarray:
        """Embeddings of a whole ImageSet, decoded in parallel threads ahead of inference."""
        return embed_image_set(self.embed_arrays, images, self.preprocessing, batch_size, workers, progress)
