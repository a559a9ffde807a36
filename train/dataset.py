"""Torch views of an ImageSet: preprocessed (and optionally augmented) tensors with labels."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from metricsearch.models.preprocessing import Preprocessing
from metricsearch.train.data import ImageSet


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


def embed_image_set(
    forward: Callable[[torch.Tensor], torch.Tensor | np.ndarray],
    images: ImageSet,
    preprocessing: Preprocessing,
    batch_size: int = 256,
    num_workers: int = 0,
    progress: bool = False,
    desc: str = "embedding",
) -> np.ndarray:
    """Embeddings (N x dim float32) of every image of `images`, in order, by `forward` on preprocessed batches."""
    from tqdm.auto import tqdm

    dataset = ImageDataset(images, preprocessing, cache=False)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    out = []
    for images, _, _ in tqdm(loader, desc=desc, disable=None if progress else True, leave=False, unit="batch"):
        emb = forward(images)
        out.append(emb.detach().float().cpu().numpy() if isinstance(emb, torch.Tensor) else np.asarray(emb, np.float32))
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)
