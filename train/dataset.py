"""The training view of an ImageSet: preprocessed (and optionally augmented) tensors with labels and indices."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from metricsearch.models.preprocessing import Preprocessing
from metricsearch.data import ImageSet


class ImageDataset(Dataset):
    """Items (image tensor, label, index); resized images are cached in memory, as 8-bit pixels, when `cache` is set."""

    def __init__(
        self, images: ImageSet, preprocessing: Preprocessing,
        augment: Callable[[Image.Image], Image.Image] | None = None, cache: bool = True,
    ) -> None:
        self.images, self.preprocessing, self.augment = images, preprocessing, augment
        self._cache: dict[int, np.ndarray] | None = {} if cache else None

    def __len__(self) -> int:
        return len(self.images)

    def pixels(self, i: int) -> np.ndarray:
        """Image i resized by the preprocessing policy, as its 8-bit H x W (x C) pixels (cached)."""
        if self._cache is not None and i in self._cache:
            return self._cache[i]
        pixels = np.asarray(self.preprocessing.resized(self.images.load(i)), dtype=np.uint8)
        if self._cache is not None:
            self._cache[i] = pixels
        return pixels

    def resized(self, i: int) -> Image.Image:
        """Image i resized by the preprocessing policy."""
        return Image.fromarray(self.pixels(i))

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int, int]]:
        """The items of a batch (the DataLoader's batched fetch): without augmentation, normalised all at once."""
        labels = self.images.labels[indices].tolist()
        if self.augment is None:
            batch = self.preprocessing.normalized_batch(np.stack([self.pixels(i) for i in indices]))
        else:
            batch = np.stack([self.preprocessing.normalized(self.augment(self.resized(i))) for i in indices])
        return list(zip(torch.from_numpy(batch).unbind(0), labels, indices))
