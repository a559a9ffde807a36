"""The training view of an ImageSet: a batch fetched at once equals its images preprocessed one by one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from metricsearch.data import load_split
from metricsearch.models.preprocessing import Preprocessing
from metricsearch.train.augment import build_augment
from metricsearch.train.dataset import ImageDataset

BATCHES = [[5, 0, 17, 5], [3, 29, 11]]  # a repeated index too, as the samplers may draw


class OneByOne(Dataset):
    """A dataset's items fetched one at a time: the DataLoader's fetch without `__getitems__`."""

    def __init__(self, dataset: ImageDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        return self.dataset[i]


@pytest.fixture(scope="module")
def digits():
    return load_split("digits").train.subset(list(range(30)))


@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("pre", [Preprocessing(size=20, mean=(0.1,), std=(0.3,)),
                                 Preprocessing(size=24, channels=3, mean=(0.4, 0.5, 0.6), std=(0.2, 0.25, 0.3))])
def test_a_loaded_batch_is_each_image_resized_then_normalised(digits, pre: Preprocessing, cache: bool) -> None:
    dataset = ImageDataset(digits, pre, cache=cache)
    for epoch in range(2):  # the second from the cache, when there is one
        for batch, (images, labels, indices) in zip(BATCHES, DataLoader(dataset, batch_sampler=BATCHES)):
            expected = np.stack([pre(digits.load(i)) for i in batch])
            assert images.dtype == torch.float32 and images.shape == (len(batch), pre.channels, pre.size, pre.size)
            assert np.array_equal(images.numpy(), expected)
            assert labels.tolist() == digits.labels[batch].tolist() and indices.tolist() == batch
    item = dataset[7]
    assert np.array_equal(item[0].numpy(), pre(digits.load(7))) and item[1:] == (int(digits.labels[7]), 7)
    assert len(dataset._cache or {}) == (len({i for b in BATCHES for i in b} | {7}) if cache else 0)


def test_an_augmented_batch_is_each_image_augmented_in_turn(digits) -> None:
    pre = Preprocessing(size=28)
    dataset = ImageDataset(digits, pre, build_augment({"name": "affine", "degrees": 30, "fill": 0}, 28))
    torch.manual_seed(3)
    images, labels, _ = next(iter(DataLoader(dataset, batch_sampler=BATCHES[:1])))
    torch.manual_seed(3)
    one_by_one, _, _ = next(iter(DataLoader(OneByOne(dataset), batch_sampler=BATCHES[:1])))
    plain = np.stack([pre(digits.load(i)) for i in BATCHES[0]])
    assert torch.equal(images, one_by_one) and not np.allclose(images.numpy(), plain)
    assert not torch.equal(images[0], images[3])  # the same image twice: two draws
    assert labels.tolist() == digits.labels[BATCHES[0]].tolist()
