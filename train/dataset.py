"""The training view of an ImageSet: preprocessed (and optionally augmented) tensors with labels and indices."""

from __future__ import annotations

from typing import Callable

import torch
from PIL import Image
from torch.utils.data import Dataset

from metricsearch.models.preprocessing import Preprocessing
from metricsearch.data import ImageSet


class ImageDataset(Dataset):
    """Items (image tensor, label, index); resized images are cached in memory when `cache` is set."""

    def __init__(
        self, images: ImageSet, preprocessing: Preprocessing,
        augment: Callable[[Image.Image], Image.Image] | None = None, cache: bool = True,
    ) -> None:
        self.images, self.preprocessing, self.augment = images, preprocessing, augment
        self._cache: dict[int, Image.Image] | None = {} if cache else None

    def __len__(self) -> int:
        return len(self.images)

    def resized(self, i: int) -> Image.Image:
        """Image i resized by the preprocessing policy (cached)."""
        if self._cache is not None and i in self._cache:
            return self._cache[i]
        im = self.preprocessing.resized(self.images.load(i))
        if self._cache is not None:
            self._cache[i] = im
        return im

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        im = self.resized(i)
        if self.augment is not None:
            im = self.augment(im)
        return torch.from_numpy(self.preprocessing.normalized(im)), int(self.images.labels[i]), i

