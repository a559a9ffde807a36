"""What a run trains with, built from its config in one place: the data, the model, the loss and its sampler, miner
and weighting, the optimization, and the hooks of the optional parts (train/hooks.py)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from metricsearch.data import DataSplit, load_split, with_transformed_classes
from metricsearch.models.torch_embedder import Embedder, build_embedder
from metricsearch.train.augment import BatchAugment, build_augment
from metricsearch.train.components import build_components
from metricsearch.train.config import TrainConfig
from metricsearch.train.cross_batch_memory import CrossBatchMemory, MemoryHook
from metricsearch.train.dataset import ImageDataset
from metricsearch.train.device import amp_dtype, resolve_device, tensor_layout
from metricsearch.train.distill import DistillHook
from metricsearch.train.distributed import DistContext, init_distributed, wrap_model
from metricsearch.train.ema import EmaHook, WeightAverage
from metricsearch.train.hooks import Hook, Hooks
from metricsearch.train.losses.base import MetricLoss, Mined
from metricsearch.train.optim import build_optimizer, build_schedule
from metricsearch.train.samplers import LabelBatchSampler
from metricsearch.train.tensorboard_log import TensorBoardHook
from metricsearch.train.trunk_cache import TrunkCache, build_trunk_cache
from metricsearch.train.weightings import Weighting


@dataclass
class Setup:
    """What a run trains with, built from its config before its run directory is made."""

    config: TrainConfig
    device: torch.device
    autocast: torch.dtype | None
    split: DataSplit
    model: Embedder
    forward: Callable[[Tensor], Tensor]  # a batch's embeddings: the model (in DistributedDataParallel under
    # torchrun), or, with a trunk cache, its trainable rest on the cached trunk outputs
    dist: DistContext
    loss: MetricLoss
    criterion: Callable[..., Tensor]  # what each step calls for the loss: `loss`, or the cross-batch memory around it
    sampler: LabelBatchSampler
    miner: Callable[..., Mined] | None
    weighting: Weighting | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    dataset: ImageDataset
    trunk_cache: TrunkCache | None = None  # config trunk_cache: the steps train on cached trunk outputs, not images
    layout: torch.memory_format = torch.contiguous_format  # of the model's weights and the batches (tensor_layout)
    batch_augment: BatchAugment | None = None  # what each step applies to its batch on the device (batch_affine)
    hooks: Hooks = field(default_factory=Hooks)  # the optional parts the loop calls (build_hooks)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_setup(config: TrainConfig, progress: bool = False) -> Setup:
    """Everything a config trains with, on its device (this rank's under torchrun), the model seeded by `seed`."""
    dist, device = init_distributed(resolve_device(config.device))
    autocast = amp_dtype(device, config.amp)
    split = load_split(config.dataset, download=config.download, split_classes=config.split_classes,
                       split=config.split, val_classes=config.val_classes, seed=config.seed)
    split = replace(split, train=with_transformed_classes(split.train, config.augment_classes))
    if progress and dist.is_main:
        for note in split.notes:
            print(f"data: {note}", flush=True)
    seed_everything(config.seed)
    model = build_embedder(config.model.model_dump(mode="json"), pretrained=config.model.pretrained)
    loss, sampler, miner, weighting = build_components(config, split.train, dist, model.part_dim)
    memory = build_memory(config, loss, sampler, miner, weighting, model.part_dim)
    model.to(device)
    loss.to(device)
    if memory is not None:
        memory.to(device)
    layout = tensor_layout(device, config.channels_last)
    model.to(memory_format=layout)
    average = build_average(config, model, len(sampler))
    optimizer = build_optimizer(config.optimizer, model, loss)
    scheduler = build_schedule(config.schedule, optimizer, len(sampler), config.epochs)
    scaler = torch.amp.GradScaler("cuda", enabled=autocast is torch.float16)
    pre = model.preprocessing
    augment = build_augment(config.augment, pre.size, pre.mean, pre.std)
    on_batch = augment if isinstance(augment, BatchAugment) else None  # applied to each batch on the device
    dataset = ImageDataset(split.train, pre, None if on_batch else augment, cache=config.cache_images)
    cache = None
    if config.trunk_cache:
        if dist.world_size > 1:
            raise ValueError("trunk_cache trains in one process: set trunk_cache: 0 under torchrun")
        cache = build_trunk_cache(model, dataset, config.trunk_cache, config.seed, device,
                                  num_workers=config.num_workers, autocast=autocast, progress=progress,
                                  augment=on_batch)
    setup = Setup(config=config, device=device, autocast=autocast, split=split, model=model,
                  forward=wrap_model(model, dist, device) if cache is None else model.embed_from_trunk, dist=dist,
                  loss=loss, criterion=loss if memory is None else memory, sampler=sampler, miner=miner,
                  weighting=weighting, optimizer=optimizer, scheduler=scheduler, scaler=scaler, dataset=dataset,
                  trunk_cache=cache, layout=layout,
                  batch_augment=None if cache is not None else on_batch)  # with a trunk cache, the copies hold it
    setup.hooks = build_hooks(setup, memory, average)
    return setup


def build_hooks(setup: Setup, memory: CrossBatchMemory | None, average: WeightAverage | None) -> Hooks:
    """The hooks of the optional parts the config turns on, in the order the loop calls them: the cross-batch
    memory's, the weight average's, the distillation's and (on rank 0) TensorBoard's."""
    config = setup.config
    hooks: list[Hook] = []
    if memory is not None:
        hooks.append(MemoryHook(memory))
    if average is not None:
        hooks.append(EmaHook(setup.model, average, config.epochs))
    # always: a resumed run that distilled needs its targets back, even with distill.epochs set to 0 since
    hooks.append(DistillHook(config, setup, setup.model, setup.loss, setup.split.train, setup.device,
                             len(setup.sampler), write=setup.dist.is_main))
    if config.logging.tensorboard and setup.dist.is_main:
        hooks.append(TensorBoardHook(setup.model, setup.split.val, setup.loss, config.seed))
    return Hooks(hooks)


def build_average(config: TrainConfig, model: Embedder, steps_per_epoch: int) -> WeightAverage | None:
    """The moving average of the model's weights the `ema` section asks for (None for span 0)."""
    if not config.ema.span:
        return None
    return WeightAverage(model, max(1.0, config.ema.span * steps_per_epoch),
                         start_step=config.ema.start_epoch * steps_per_epoch)


def build_memory(config: TrainConfig, loss: MetricLoss, sampler: LabelBatchSampler,
                 miner: Callable[..., Mined] | None, weighting: Weighting | None, dim: int) -> CrossBatchMemory | None:
    """The cross-batch memory the `memory` section asks for (None for size 0), checked against the components."""
    if config.memory.size == 0:
        return None
    if miner is not None or weighting is not None or sampler.fixes_pairs:
        raise ValueError("memory (a cross-batch memory) compares with all of its pairs: drop the miner and the "
                         "weighting, use the group sampler, or set memory.size: 0")
    return CrossBatchMemory(loss, config.memory.size, dim, start_step=config.memory.start_epoch * len(sampler))
