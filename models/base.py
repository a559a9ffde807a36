"""The base of every embedder: PIL images and whole ImageSets embedded through the one `embed_arrays`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import numpy as np
from PIL import Image

from metricsearch.data import ImageSet
from metricsearch.models.image_set_embedding import embed_image_set
from metricsearch.models.memory_budget import DEFAULT_MEMORY, MAX_BATCH, batch_within, bytes_per_image
from metricsearch.models.preprocessing import Preprocessing


class ArrayEmbedder(ABC):
    """An embedder of preprocessed arrays (`embed_arrays`), with the `preprocessing` its inputs need."""

    preprocessing: Preprocessing
    #: the peak resident memory, in bytes, that `embed_set` keeps this process within when it chooses the batch
    memory: int = DEFAULT_MEMORY
    #: the largest batch that `embed_set` chooses
    largest_batch: int = MAX_BATCH

    @abstractmethod
    def embed_arrays(self, batch: np.ndarray) -> np.ndarray:
        """Embeddings (N x dim float32) of preprocessed images (N x C x H x W float32)."""

    def embed_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        """Embeddings of PIL images, preprocessed as the embedder expects."""
        return self.embed_arrays(self.preprocessing.batch(list(images)))

    def embed_set(self, images: ImageSet, batch_size: int | None = None, progress: bool = False,
                  workers: int | None = None) -> np.ndarray:
        """Embeddings of a whole ImageSet, decoded in parallel threads ahead of inference, in batches of
        `batch_size` (None: the largest that keeps this process within `self.memory` bytes, `batch_within`)."""
        batch_size = batch_size or self.batch_within(self.memory)
        return embed_image_set(self.embed_arrays, images, self.preprocessing, batch_size, workers, progress)

    def batch_within(self, memory: int = DEFAULT_MEMORY) -> int:
        """The largest inference batch (at most `largest_batch`) that keeps this process within `memory` bytes at
        its peak, from its bytes per image measured once on this embedder (see models/memory_budget.py)."""
        chosen = self.__dict__.setdefault("_batches", {})
        if memory not in chosen:
            p = self.preprocessing
            shape = (p.channels, p.size, p.size)
            if "_per_image" not in self.__dict__:
                self.__dict__["_per_image"] = bytes_per_image(self.embed_arrays, shape)
            chosen[memory] = batch_within(memory, self.embed_arrays, shape, most=self.largest_batch,
                                          per_image=self.__dict__["_per_image"])
        return chosen[memory]
