"""The trainer: config -> run directory with metrics, checkpoints and a plot; resumable."""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
import yaml
from torch import Tensor
from torch.utils.data import DataLoader

from metricsearch.data import DataSplit, ImageSet, load_split, original_images, with_transformed_classes
from metricsearch.errors import MetricsearchError
from metricsearch.evaluation import evaluate_split
from metricsearch.models.torch_embedder import Embedder, build_embedder
from metricsearch.train import losses, sampling
from metricsearch.train.augment import BatchAugment, build_augment
from metricsearch.train.board import Board
from metricsearch.train.config import DEFAULTS, TrainConfig, typed_config
from metricsearch.train.context import TrainContext
from metricsearch.train.dataset import ImageDataset
from metricsearch.train.distill import TARGETS_FILE, distance_to_targets, distill_optimization, view_targets
from metricsearch.train.device import amp_dtype, memory_format, resolve_device
from metricsearch.train.distributed import (
    DistContext, average_gradients, barrier, gather_batch, init_distributed, shutdown, wrap_model,
)
from metricsearch.train.ema import WeightAverage
from metricsearch.train.heap import keep_heap, kept_heap
from metricsearch.train.losses.base import MetricLoss, Mined, Weighting
from metricsearch.train.memory import CrossBatchMemory
from metricsearch.train.optim import build_optimizer, build_schedule
from metricsearch.train.plots import plot_training
from metricsearch.train.sampling.base import LabelBatchSampler
from metricsearch.train.sampling.compat import check_compatible
from metricsearch.train.trunk_cache import TrunkCache, build_trunk_cache
from metricsearch.train.whitening import fit_whitening

#: a test hook: set to N, training says "paused before step N" on stderr and waits for a signal (e.g. Ctrl-C) there
PAUSE_AT_STEP = "METRICSEARCH_PAUSE_AT_STEP"

#: resuming may change these keys of a run's config: how long it trains (its own epochs, then the distillation's)
#: and how it logs and keeps freed memory
RESUMABLE_CHANGES = ("epochs", "log_every", "keep_heap", "distill")
#: top-level keys added since some runs were saved, with the value that reproduces those runs (before issue 88 no
#: training classes validated); other added keys compare with their defaults
SAVED_BEFORE = {"val_classes": 0.0}


class TrainingError(MetricsearchError):
    """Training cannot go on (e.g. the loss became NaN); the last good checkpoint is kept."""


class RunExistsError(FileExistsError):
    """The run directory already holds a run (and neither resuming nor overwriting was asked for)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(f"{run_dir} already holds a run; pass resume=True to continue it, overwrite=True to "
                         "replace it, or give the config another name for a new run")
        self.run_dir = run_dir


@dataclass
class RunResult:
    """What a finished training run produced."""

    run_dir: Path
    epochs: int
    val_recall_at_1: float | None  # best.pt's Recall@1 on the validation classes; None without validation classes
    last_metrics: dict[str, Any]  # the last epoch's row of metrics.jsonl
    is_main: bool = True  # False on the ranks other than 0 under torchrun, which write nothing
    test: dict[str, Any] | None = None  # the final record: the test classes scored once, with best.pt
    off_the_shelf: dict[str, Any] | None = None  # the pretrained backbone's record on the validation classes


@dataclass
class Setup:
    """What a run trains with, built from its config before its run directory is made."""

    config: TrainConfig
    device: torch.device
    autocast: torch.dtype | None
    split: DataSplit
    model: Embedder
    forward: torch.nn.Module  # the model, in DistributedDataParallel under torchrun
    dist: DistContext
    loss: MetricLoss
    sampler: LabelBatchSampler
    miner: Callable[..., Mined] | None
    weighting: Weighting | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    dataset: ImageDataset
    trunk_cache: TrunkCache | None = None  # config trunk_cache: the steps train on cached trunk outputs
    memory: CrossBatchMemory | None = None  # config memory.size > 0: the loss also compares with earlier batches
    layout: torch.memory_format = torch.contiguous_format  # of the model's weights and the batches (memory_format)
    batch_augment: BatchAugment | None = None  # what each step applies to its batch on the device (batch_affine)
    targets: Tensor | None = None  # in the distillation epochs: each training image's target embedding, on the device
    average: WeightAverage | None = None  # config ema.span > 0: the weights' moving average over the own epochs


@dataclass
class RunState:
    """What a run has done so far: one metrics row per finished epoch, its best validation Recall@1, and the
    off-the-shelf features' record measured before its first epoch."""

    history: list[dict[str, Any]] = field(default_factory=list)
    best_recall_at_1: float = -1.0
    off_the_shelf: dict[str, Any] | None = None


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def train(
    config: dict[str, Any], resume: bool = False, overwrite: bool = False, progress: bool = True,
    stop_after_epoch: int | None = None,
) -> RunResult:
    """Train an embedder as the config says, evaluating and checkpointing into OUTPUT_DIR/NAME/.

    `stop_after_epoch` pauses the run after that epoch (resume it later with `resume=True`).
    Under `torchrun --nproc_per_node=N` the N processes train one model on the global batch;
    only rank 0 evaluates and writes the run directory.
    The epochs are evaluated on the validation classes (config `val_classes`), whose best Recall@1 keeps best.pt
    (without them, best.pt is the last epoch); the test classes are scored once, after the last epoch, with best.pt.
    """
    settings = typed_config(config)
    with kept_heap(keep_heap(resolve_device(settings.device), settings.keep_heap)):
        return _train(settings, resume, overwrite, progress, stop_after_epoch)


def _train(
    settings: TrainConfig, resume: bool, overwrite: bool, progress: bool, stop_after_epoch: int | None,
) -> RunResult:
    setup = build_setup(settings, progress)
    main, board, test = setup.dist.is_main, None, None
    try:
        run_dir = _prepare_run_dir(settings, resume, overwrite, write=main)
        state = restore(setup, run_dir) if resume else RunState()
        board = Board(run_dir) if main and settings.logging.tensorboard else None
        if main and not state.history and setup.split.val is not None and settings.model.pretrained:
            state.off_the_shelf = score_off_the_shelf(setup)
            if board is not None:
                board.row(state.off_the_shelf, "off_the_shelf/")
            if progress:
                print(f"off-the-shelf {settings.model.backbone}: R@1 {_recall_at_1(state.off_the_shelf):.3f} on "
                      f"{state.off_the_shelf['classes']} validation classes, before the first epoch", flush=True)
        if main:
            _write_metrics(run_dir, state)
        epochs = settings.all_epochs
        for epoch in range(len(state.history), min(epochs, stop_after_epoch or epochs)):
            if epoch == settings.epochs:
                start_distillation(setup, run_dir, write=main)
            row = train_epoch(setup, epoch, run_dir, progress and main)
            if setup.average is not None and epoch + 1 == settings.epochs:
                setup.average.apply(setup.model)  # the average takes the weights' place when the own epochs end
            if not main:
                state.history.append(row)
                continue
            # never the test classes: without validation classes no epoch is evaluated, best.pt is the last
            validated = setup.split.val is not None and ((epoch + 1) % settings.eval.every == 0 or epoch + 1 == epochs)
            if settings.model.whiten and (validated or epoch + 1 == epochs):
                fit_whitening(setup.model, original_images(setup.split.train))
            if validated:
                row.update(_evaluate(setup.model, setup.split, settings, validation=True))
                if board is not None:
                    board.evaluation(epoch + 1, setup.model, setup.split.val, setup.loss, settings.seed)
            save_epoch(setup, state, row, run_dir)
            if board is not None:
                board.row(row)
            if progress:
                _report(row, epoch, epochs)
        if main and len(state.history) == epochs and len(setup.split.test):
            test = score_test(setup, state, run_dir)
            if board is not None:
                board.row(test, "test/")
            if progress:
                print("\n".join(closing_lines(settings, state, test)), flush=True)
        barrier(setup.dist)  # the other ranks wait for rank 0's last evaluation and checkpoint
    finally:
        if board is not None:
            board.close()
        shutdown(setup.dist)
    best = state.best_recall_at_1 if state.best_recall_at_1 >= 0 else None
    return RunResult(run_dir, len(state.history), best, state.history[-1] if state.history else {}, main, test,
                     state.off_the_shelf)


def score_off_the_shelf(setup: Setup) -> dict[str, Any]:
    """The off-the-shelf record: the validation classes' scores of the run's backbone with its pretrained weights,
    untrained and without a head (its pooled, L2-normalised features, as `metricsearch export --backbone` writes
    them), at the run's preprocessing."""
    model = setup.config.model
    baseline = Embedder(model.backbone, dim=None, normalize=True, pretrained=model.pretrained,
                        preprocessing=model.preprocessing, backbone_params=model.backbone_params).to(setup.device)
    return {"epoch": 0, "model": "off-the-shelf", "backbone": model.backbone, "pretrained": model.pretrained,
            **_evaluate(baseline, setup.split, setup.config, validation=True)}


def score_test(setup: Setup, state: RunState, run_dir: Path) -> dict[str, Any]:
    """The run's final record: the held-out test classes scored once, with best.pt's weights (loaded into the
    setup's model where it is not the last epoch); metrics.jsonl ends with it."""
    best = torch.load(run_dir / "best.pt", map_location="cpu", weights_only=False)
    if best["epoch"] != len(state.history):
        setup.model.load_state_dict(best["model"])
    chosen = "validation Recall@1" if setup.split.val is not None else "last epoch"
    test = {"epoch": best["epoch"], "checkpoint": "best.pt", "chosen_by": chosen,
            **_evaluate(setup.model, setup.split, setup.config, validation=False)}
    _write_metrics(run_dir, state, test)
    return test


def closing_lines(config: TrainConfig, state: RunState, test: dict[str, Any]) -> list[str]:
    """What a run ends by saying: its test score and the checkpoint that made it; where the backbone was pretrained
    and validated, the fine-tuned against the off-the-shelf Recall@1 on the validation classes, and whether that
    helped."""
    chosen = (f"epoch {test['epoch']}, the best validation Recall@1" if test["chosen_by"] != "last epoch"
              else f"the last epoch, {test['epoch']}: no validation classes")
    lines = [f"test: R@1 {_recall_at_1(test):.3f}  MAP@R {test['map_at_r']:.3f} on the {test['classes']} held-out "
             f"test classes, scored once with best.pt ({chosen})"]
    shelf = state.off_the_shelf
    if shelf is not None:
        tuned, base = state.best_recall_at_1, _recall_at_1(shelf)
        lines.append(f"fine-tuned {tuned:.3f} vs off-the-shelf {base:.3f} Recall@1 on {shelf['classes']} validation "
                     "classes")
        if tuned <= base:
            weights = "imagenet" if shelf["pretrained"] is True else shelf["pretrained"]
            lines.append("fine-tuning did not help: export the off-the-shelf features instead with `metricsearch "
                         f"export --backbone {config.model.backbone} --pretrained {weights} --out off-the-shelf.onnx`")
    return lines


def _recall_at_1(record: dict[str, Any]) -> float:
    """The Recall@1 of an evaluation record (its keys are numbers, or text once read back from JSON)."""
    recall = record["recall_at_k"]
    return float(recall[1] if 1 in recall else recall["1"])


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
    layout = memory_format(device, config.channels_last)
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
    return Setup(config, device, autocast, split, model, wrap_model(model, dist, device), dist, loss, sampler, miner,
                 weighting, optimizer, scheduler, scaler, dataset, cache, memory, layout,
                 None if cache is not None else on_batch,  # with a trunk cache, the views hold it already
                 average=average)


def start_distillation(setup: Setup, run_dir: Path, write: bool = True, targets: Tensor | None = None) -> None:
    """Turn the setup to its distillation epochs: a fresh optimizer and schedule, and the targets given (a resumed
    run's), else those of the model as it is now (saved in the run directory if `write`)."""
    config = setup.config
    setup.optimizer, setup.scheduler = distill_optimization(config, setup.model, setup.loss, len(setup.sampler))
    if targets is None:
        targets = view_targets(setup.model, setup.split.train, views=config.distill.views(config.model))
        if write:
            _save(targets, run_dir / TARGETS_FILE)
    setup.targets = targets.to(setup.device)


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


def build_components(
    config: TrainConfig, images: ImageSet, dist: DistContext = DistContext(), embedding_dim: int | None = None,
) -> tuple[MetricLoss, LabelBatchSampler, Callable[..., Mined] | None, Weighting | None]:
    """The loss, batch sampler (this rank's share), miner and weighting a config names for `images`, checked to fit;
    `embedding_dim`, the model's training embedding's (`part_dim`), sizes a proxy loss's proxies."""
    context = TrainContext.of(images, embedding_dim=embedding_dim)
    loss_name, loss_params = config.component("loss")
    loss = losses.build(loss_name, context, **loss_params)
    sampler_name, sampler_params = config.component("sampler")
    sampler = sampling.build_sampler(sampler_name, context.labels, context.groups, seed=config.seed,
                                     batches_per_epoch=config.batches_per_epoch, rank=dist.rank,
                                     world_size=dist.world_size, **sampler_params)
    miner_name, miner_params = config.component("miner")
    miner = sampling.build_miner(miner_name, **miner_params) if miner_name else None
    weighting_name, weighting_params = config.component("weighting")
    weighting = (sampling.build_weighting(weighting_name, replace(context, sampler=sampler), **weighting_params)
                 if weighting_name else None)
    check_compatible(loss, miner, weighting, sampler)
    return loss, sampler, miner, weighting


def train_epoch(setup: Setup, epoch: int, run_dir: Path, progress: bool = False) -> dict[str, Any]:
    """One pass over the sampler's batches; its metrics row (mean loss, images/s; phase: distill in the distillation).

    With a trunk cache the batches are cached trunk outputs (one random view per image), not images.
    The loss is summed on the device and read back (and checked for NaN or inf) only every
    `log_every` steps and at the end of the epoch, so that no step waits for the device.
    """
    from tqdm.auto import tqdm

    config = setup.config
    epoch_seed = config.seed * 100_003 + epoch
    seed_everything(epoch_seed)  # per-epoch seeding makes --resume exact
    setup.sampler.set_epoch(epoch)
    loader = epoch_batches(setup, epoch_seed)
    setup.model.train()
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{config.all_epochs}", disable=None if progress else True,
               unit="batch", leave=False, total=len(setup.sampler))
    total = torch.zeros((), dtype=torch.float64, device=setup.device)
    t0, seen, steps, checked = time.perf_counter(), 0, 0, 0
    pause_at = int(os.environ.get(PAUSE_AT_STEP, -1))
    for images, labels, indices in bar:
        if epoch * len(setup.sampler) + steps == pause_at:
            _pause(pause_at)
        total += train_step(setup, images, labels, indices)
        seen, steps = seen + len(images) * setup.dist.world_size, steps + 1
        if setup.average is not None and epoch < config.epochs:
            setup.average.update(setup.model, epoch * len(setup.sampler) + steps - 1)
        if steps % config.log_every == 0:
            mean, checked = finite_mean(total, steps, checked, epoch, run_dir), steps
            bar.set_postfix(loss=f"{mean:.4f}", img_s=f"{seen / (time.perf_counter() - t0):.0f}")
    bar.close()
    mean = finite_mean(total, steps, checked, epoch, run_dir)
    return {"epoch": epoch + 1, "loss": mean, "images_per_s": seen / (time.perf_counter() - t0),
            "lr": setup.scheduler.get_last_lr()[0], "world_size": setup.dist.world_size,
            **({"phase": "distill"} if setup.targets is not None else {})}


def epoch_batches(setup: Setup, seed: int) -> Iterable[tuple[Tensor, Tensor, Tensor]]:
    """(images, labels, indices) of the sampler's batches for its current epoch, as the steps take them: from the
    trunk cache (a view per image drawn with `seed`) when there is one, else loaded and augmented."""
    if setup.trunk_cache is not None:
        return cached_batches(setup.trunk_cache, setup.sampler, setup.split.train.labels,
                              torch.Generator().manual_seed(seed))
    return DataLoader(setup.dataset, batch_sampler=setup.sampler, num_workers=setup.config.num_workers,
                      pin_memory=setup.device.type == "cuda")


def cached_batches(
    cache: TrunkCache, sampler: LabelBatchSampler, labels: np.ndarray, generator: torch.Generator,
) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """(trunk outputs, labels, indices) of the sampler's batches from the cache, a view drawn per image."""
    for batch in sampler:
        indices = torch.as_tensor(batch, dtype=torch.long)
        yield cache.batch(indices, generator), torch.as_tensor(labels[indices.numpy()]), indices


def train_step(setup: Setup, images: Tensor, labels: Tensor, indices: Tensor) -> Tensor:
    """One optimisation step on a batch (the global batch under torchrun); its loss, detached, on the device.
    With a trunk cache, `images` are the cached trunk outputs."""
    device = setup.device
    cuda = device.type == "cuda"  # pinned batches: the copies need not wait
    images = images.to(device, non_blocking=cuda)
    if setup.batch_augment is not None:
        images = setup.batch_augment(images)
    if images.dim() == 4:
        images = images.contiguous(memory_format=setup.layout)
    labels = labels.to(device, non_blocking=cuda)
    with torch.autocast(device.type, dtype=setup.autocast or torch.float32, enabled=setup.autocast is not None):
        emb = setup.forward(images) if setup.trunk_cache is None else setup.model.embed_from_trunk(images)
    emb, labels, indices = gather_batch(emb.float(), labels, indices.to(device, non_blocking=cuda), setup.dist)
    mined = setup.sampler.pairs(labels)
    if setup.miner is not None:
        mined = setup.miner(emb.detach(), labels, mined)
    compute = setup.loss if setup.memory is None else setup.memory
    parts = setup.model.member_embeddings(emb)  # an ensemble's members: each its own loss
    loss = sum(compute(part, labels, mined=mined, weighting=setup.weighting, indices=indices) for part in parts)
    loss = loss / len(parts)
    if setup.targets is not None:
        loss = loss + setup.config.distill.weight * distance_to_targets(emb, setup.targets[indices])
    setup.optimizer.zero_grad(set_to_none=True)
    setup.scaler.scale(loss).backward()
    average_gradients(setup.loss, setup.dist)  # the loss's own parameters (proxies, betas): one copy per rank
    setup.scaler.step(setup.optimizer)
    setup.scaler.update()
    setup.scheduler.step()
    setup.sampler.observe(indices.tolist(), emb.detach())
    return loss.detach()


def finite_mean(total: Tensor, steps: int, checked: int, epoch: int, run_dir: Path) -> float:
    """The mean loss of an epoch's first `steps` steps; a TrainingError if one since step `checked` was NaN or inf."""
    mean = total.item() / max(steps, 1)
    if not math.isfinite(mean):
        where = f"step {steps}" if steps == checked + 1 else f"one of steps {checked + 1}-{steps}"
        raise TrainingError(
            f"loss became {mean} at epoch {epoch + 1}, {where}; "
            f"{run_dir / 'last.pt'} still holds the last good state. Start again with a lower "
            "optimizer.lr (--overwrite), check the loss parameters, or try amp=off."
        )
    return mean


def save_epoch(setup: Setup, state: RunState, row: dict[str, Any], run_dir: Path) -> None:
    """Record a finished epoch: metrics.jsonl, training.png, last.pt and best.pt: where the epoch beat the earlier
    ones on the validation classes (`_selection_score`), or every epoch without validation classes."""
    state.history.append(row)
    _write_metrics(run_dir, state)  # rewritten from the checkpoint's history on --resume
    config = setup.config
    plot_training(state.history, run_dir / "training.png",
                  title=f"{config.name}: {config.component('loss')[0]} on {config.dataset}")
    score = _selection_score(row)
    earlier = [e for e in map(_selection_score, state.history[:-1]) if e is not None]
    improved = setup.split.val is None or score is not None and all(score > e for e in earlier)  # else: the last
    if improved and score is not None:
        state.best_recall_at_1 = score[0]
    checkpoint = {
        **setup.model.checkpoint(), "loss": setup.loss.state_dict(), "optimizer": setup.optimizer.state_dict(),
        "scheduler": setup.scheduler.state_dict(), "scaler": setup.scaler.state_dict(),
        **({"memory": setup.memory.state_dict()} if setup.memory is not None else {}),
        **({"ema": setup.average.state_dict()} if setup.average is not None else {}),
        **({"distill_after": config.epochs} if setup.targets is not None else {}),  # the run's own epochs
        "epoch": len(state.history), "history": state.history, "best_recall_at_1": state.best_recall_at_1,
        "off_the_shelf": state.off_the_shelf,
        "config": config.model_dump(mode="json"), "class_names": setup.split.test.class_names,
        "data_notes": setup.split.notes,
    }
    if improved:
        _save(checkpoint, run_dir / "best.pt")
    _save(checkpoint, run_dir / "last.pt")


def _selection_score(row: dict[str, Any]) -> tuple[float, float] | None:
    """What best.pt maximises, of an epoch evaluated on the validation classes: its Recall@1, then (between equals,
    as when a few classes saturate Recall@1) its MAP@R; None for an epoch not evaluated."""
    if "recall_at_k" not in row:
        return None
    return _recall_at_1(row), float(row["map_at_r"])


def restore(setup: Setup, run_dir: Path) -> RunState:
    """Load the run's last.pt into the setup's model, loss and optimisation; what the run had done."""
    state = torch.load(run_dir / "last.pt", map_location="cpu", weights_only=False)
    own, done = setup.config.epochs, len(state["history"])
    after = state.get("distill_after")  # the run's own epochs, once it distils
    if (after is not None and after != own) or (after is None and done > own and setup.config.distill.epochs):
        raise ValueError(f"--resume: the run trained {after or done} epochs of its own, which its distillation "
                         f"follows; set epochs: {after or done}")
    setup.model.load_state_dict(state["model"])
    setup.loss.load_state_dict(state["loss"])
    if "distill_after" in state:
        targets = run_dir / TARGETS_FILE
        if not targets.is_file():
            raise FileNotFoundError(f"--resume: {targets}, the distillation's targets, is gone; train the run again "
                                    "(--overwrite)")
        start_distillation(setup, run_dir, targets=torch.load(targets, map_location="cpu", weights_only=True))
    setup.optimizer.load_state_dict(state["optimizer"])
    setup.scheduler.load_state_dict(state["scheduler"])
    setup.scaler.load_state_dict(state["scaler"])
    if setup.memory is not None:
        setup.memory.load_state_dict(state["memory"])
    if setup.average is not None:
        setup.average.load_state_dict(state["ema"])
    return RunState(state["history"], state["best_recall_at_1"], state.get("off_the_shelf"))


def _evaluate(model: Embedder, split: DataSplit, config: TrainConfig, validation: bool) -> dict[str, Any]:
    """Recall@K, NMI and MAP@R of `model` on the split's validation classes (every image against the others), or on
    its test classes (query vs gallery where given, and the one-shot episodes of `eval.one_shot_ways`), with the
    part's name and number of classes."""
    ev = config.eval

    def embed(images: ImageSet) -> np.ndarray:
        return model.embed_set(images, batch_size=ev.batch_size)

    if validation:
        part = replace(split, test=split.val, query=None, gallery=None)
        return {"split": "val", "classes": len(split.val.class_names),
                **evaluate_split(embed, part, ev.recall_k, ev.nmi)}
    return {"split": "test", "classes": len(split.test.class_names),
            **evaluate_split(embed, split, ev.recall_k, ev.nmi, ev.one_shot_ways)}


def _save(obj: Any, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _prepare_run_dir(settings: TrainConfig, resume: bool, overwrite: bool, write: bool = True) -> Path:
    config = settings.model_dump(mode="json")  # as config.yaml and the checkpoints keep it
    run_dir = Path(settings.output_dir) / settings.name
    last = run_dir / "last.pt"
    if resume:
        if not last.is_file():
            raise FileNotFoundError(f"--resume: {last} does not exist; start the run without --resume")
        # top-level keys added to the schema since the run was saved compare with their defaults (SAVED_BEFORE)
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        saved = typed_config({**DEFAULTS, **SAVED_BEFORE, **saved}).model_dump(mode="json")
        differ = sorted(k for k in set(saved) | set(config)
                        if k not in RESUMABLE_CHANGES and saved.get(k) != config.get(k))
        if differ:
            raise ValueError(
                f"--resume: the config differs from the run's saved config in {differ}; "
                f"only {', '.join(RESUMABLE_CHANGES)} may change when resuming"
            )
    elif last.is_file() and not overwrite:
        raise RunExistsError(run_dir)
    if write:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return run_dir


def _write_metrics(run_dir: Path, state: RunState, test: dict[str, Any] | None = None) -> None:
    """metrics.jsonl: the off-the-shelf record (epoch 0) where there is one, a row per epoch, the test record last."""
    rows = [*([state.off_the_shelf] if state.off_the_shelf else []), *state.history, *([test] if test else [])]
    with open(run_dir / "metrics.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def _pause(step: int) -> None:
    """Say that training waits before global step `step` (counted from 0), then wait until a signal ends it."""
    print(f"paused before step {step}", file=sys.stderr, flush=True)
    while True:
        time.sleep(60)


def _report(row: dict[str, Any], epoch: int, epochs: int) -> None:
    text = f"epoch {epoch + 1}/{epochs}  loss {row['loss']:.4f}  {row['images_per_s']:.0f} img/s"
    if "recall_at_k" in row:
        recalls = "  ".join(f"R@{k} {v:.3f}" for k, v in row["recall_at_k"].items())
        nmi = f"  NMI {row['nmi']:.3f}" if row.get("nmi") is not None else ""
        text += f"  |  validation {recalls}{nmi}  MAP@R {row['map_at_r']:.3f}"
    print(text, flush=True)
