"""The frozen trunk's outputs for a few augmented copies of every training image, computed once (`trunk_cache`);
a run's steps then train on them instead of loading images."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from metricsearch.models.torch_embedder import Embedder
from metricsearch.train.augment import BatchAugment
from metricsearch.train.dataset import ImageDataset
from metricsearch.train.deprecated_aliases import warn_renamed
from metricsearch.train.samplers import LabelBatchSampler


class TrunkCache:
    """copies x images trunk feature maps (float16, on the CPU); a batch takes one random copy per image."""

    def __init__(self, features: Tensor) -> None:
        self.features = features

    @property
    def copies(self) -> int:
        """Augmented copies cached per image."""
        return self.features.shape[0]

    @property
    def views(self) -> int:
        """Deprecated name of `copies` (goes in the next release)."""
        warn_renamed("TrunkCache.views", "TrunkCache.copies")
        return self.copies

    def batch(self, indices: Tensor, generator: torch.Generator) -> Tensor:
        """The cached trunk outputs (float32) of images `indices`, each from a copy drawn by `generator`."""
        copies = torch.randint(0, self.copies, (len(indices),), generator=generator)
        return self.features[copies, indices].float()

    def batches(self, sampler: LabelBatchSampler, labels: np.ndarray,
                generator: torch.Generator) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """(trunk outputs, labels, indices) of the sampler's batches, a copy drawn per image by `generator`: what a
        run's steps take instead of images."""
        for batch in sampler:
            indices = torch.as_tensor(batch, dtype=torch.long)
            yield self.batch(indices, generator), torch.as_tensor(labels[indices.numpy()]), indices


@torch.no_grad()
def build_trunk_cache(
    model: Embedder, dataset: ImageDataset, copies: int | None = None, seed: int = 0,
    device: torch.device = torch.device("cpu"), batch_size: int = 64, num_workers: int = 0,
    autocast: torch.dtype | None = None, progress: bool = False, augment: BatchAugment | None = None,
    views: int | None = None,
) -> TrunkCache:
    """The frozen trunk of `model` run once over `copies` passes of `dataset` (each pass its own seeded augmentation,
    the dataset's own or `augment` of each batch). `views`: the deprecated name of `copies` (goes in 0.2)."""
    from tqdm.auto import tqdm

    if views is not None:
        warn_renamed("build_trunk_cache(views=...)", "build_trunk_cache(copies=...)")
        copies = views
    if copies is None:
        raise TypeError("build_trunk_cache() needs copies, the augmented copies of each image to cache")

    if model.trunk is None:
        raise ValueError("trunk_cache needs a frozen trunk: set model.freeze")
    model.trunk.eval()
    features: Tensor | None = None
    with tqdm(total=copies * len(dataset), desc="trunk cache", unit="img", disable=None if progress else True,
              leave=False) as bar:
        for copy in range(copies):
            torch.manual_seed(seed * 1_000_003 + copy)  # the DataLoader seeds its workers' augmentation from this
            loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, shuffle=False)
            start = 0
            for images, _, _ in loader:
                images = images.to(device)
                if augment is not None:
                    images = augment(images)
                with torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
                    out = model.trunk(images).half().cpu()
                if features is None:
                    features = torch.empty((copies, len(dataset), *out.shape[1:]), dtype=torch.float16)
                features[copy, start:start + len(out)] = out
                start += len(out)
                bar.update(len(out))
    if features is None:
        raise ValueError("trunk_cache: the training set is empty")
    return TrunkCache(features)
