"""The frozen trunk's outputs for a few augmented views of every training image, computed once (`trunk_cache`)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from metricsearch.models.torch_embedder import Embedder
from metricsearch.train.augment import BatchAugment
from metricsearch.train.dataset import ImageDataset


class TrunkCache:
    """views x images trunk feature maps (float16, on the CPU); a batch takes one random view per image."""

    def __init__(self, features: Tensor) -> None:
        self.features = features

    @property
    def views(self) -> int:
        """Augmented views cached per image."""
        return self.features.shape[0]

    def batch(self, indices: Tensor, generator: torch.Generator) -> Tensor:
        """The cached trunk outputs (float32) of images `indices`, each from a view drawn by `generator`."""
        views = torch.randint(0, self.views, (len(indices),), generator=generator)
        return self.features[views, indices].float()


@torch.no_grad()
def build_trunk_cache(
    model: Embedder, dataset: ImageDataset, views: int, seed: int, device: torch.device, batch_size: int = 64,
    num_workers: int = 0, autocast: torch.dtype | None = None, progress: bool = False,
    augment: BatchAugment | None = None,
) -> TrunkCache:
    """The frozen trunk of `model` run once over `views` passes of `dataset` (each pass its own seeded augmentation,
    the dataset's own or `augment` of each batch)."""
    from tqdm.auto import tqdm

    if model.trunk is None:
        raise ValueError("trunk_cache needs a frozen trunk: set model.freeze")
    model.trunk.eval()
    features: Tensor | None = None
    with tqdm(total=views * len(dataset), desc="trunk cache", unit="img", disable=None if progress else True,
              leave=False) as bar:
        for view in range(views):
            torch.manual_seed(seed * 1_000_003 + view)  # the DataLoader seeds its workers' augmentation from this
            loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, shuffle=False)
            start = 0
            for images, _, _ in loader:
                images = images.to(device)
                if augment is not None:
                    images = augment(images)
                with torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
                    out = model.trunk(images).half().cpu()
                if features is None:
                    features = torch.empty((views, len(dataset), *out.shape[1:]), dtype=torch.float16)
                features[view, start:start + len(out)] = out
                start += len(out)
                bar.update(len(out))
    if features is None:
        raise ValueError("trunk_cache: the training set is empty")
    return TrunkCache(features)
