"""The training loop: config -> run directory with metrics, checkpoints and a plot; resumable.

It reads top to bottom: `train` sets the run up (train/setup.py: data, model, loss, optimizer and the hooks), then
for each epoch `train_epoch` runs the steps (`train_step`: forward, loss, backward, optimizer step), the epoch is
evaluated on the validation classes and checkpointed (`save_epoch`); the test classes are scored once at the end.
The optional parts are hooks the loop calls at fixed moments (train/hooks.py): the weight average (train/ema.py),
the distillation (train/distill.py), the cross-batch memory's checkpoints (train/cross_batch_memory.py) and
TensorBoard (train/tensorboard_log.py). Two parts are set up in place of what they replace instead: the trunk cache
(train/trunk_cache.py) gives the batches and the forward pass, the cross-batch memory is the step's loss.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from metricsearch.data import original_images
from metricsearch.errors import MetricsearchError
from metricsearch.train.components import build_components
from metricsearch.train.config import TrainConfig, typed_config
from metricsearch.train.deprecated_aliases import renamed_attribute
from metricsearch.train.device import resolve_device
from metricsearch.train.distributed import average_gradients, barrier, gather_batch, shutdown
from metricsearch.train.glibc_heap import keep_heap, kept_heap
from metricsearch.train.plots import plot_training
from metricsearch.train.run_dir import RunExistsError, RunState, prepare_run_dir, save_atomic, write_metrics
from metricsearch.train.scoring import (
    closing_lines, epoch_line, evaluate, off_the_shelf_line, score_off_the_shelf, score_test, selection_score,
)
from metricsearch.train.setup import Setup, build_setup, seed_everything
from metricsearch.train.whitening import fit_whitening

#: a test hook: set to N, training says "paused before step N" on stderr and waits for a signal (e.g. Ctrl-C) there
PAUSE_AT_STEP = "METRICSEARCH_PAUSE_AT_STEP"

__all__ = ["PAUSE_AT_STEP", "RunExistsError", "RunResult", "RunState", "Setup", "TrainingError", "build_components",
           "build_setup", "closing_lines", "epoch_batches", "restore", "save_epoch", "seed_everything", "train",
           "train_epoch", "train_step"]


class TrainingError(MetricsearchError):
    """Training cannot go on (e.g. the loss became NaN); the last good checkpoint is kept."""


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
    main, hooks, test = setup.dist.is_main, setup.hooks, None
    try:
        run_dir = prepare_run_dir(settings, resume, overwrite, write=main)
        state = restore(setup, run_dir) if resume else RunState()
        hooks.on_run_start(run_dir)
        if main and not state.history and setup.split.val is not None and settings.model.pretrained:
            state.off_the_shelf = score_off_the_shelf(setup)
            hooks.on_record(state.off_the_shelf, "off_the_shelf/")
            if progress:
                print(off_the_shelf_line(settings, state.off_the_shelf), flush=True)
        if main:
            write_metrics(run_dir, state)
        epochs = settings.all_epochs  # the run's own, then the distillation's
        for epoch in range(len(state.history), min(epochs, stop_after_epoch or epochs)):
            hooks.on_epoch_start(epoch)  # the distillation's first: a fresh optimizer and the targets
            row = train_epoch(setup, epoch, run_dir, progress and main)
            hooks.on_epoch_end(epoch, row)  # the own epochs' last: the weight average takes the weights' place
            if not main:
                state.history.append(row)
                continue
            # never the test classes: without validation classes no epoch is evaluated, best.pt is the last
            validated = setup.split.val is not None and ((epoch + 1) % settings.eval.every == 0 or epoch + 1 == epochs)
            if settings.model.whiten and (validated or epoch + 1 == epochs):
                fit_whitening(setup.model, original_images(setup.split.train))
            if validated:
                row.update(evaluate(setup.model, setup.split, settings, validation=True))
                hooks.on_evaluated(epoch)
            save_epoch(setup, state, row, run_dir)
            hooks.on_record(row)
            if progress:
                print(epoch_line(row, epoch, epochs), flush=True)
        if main and len(state.history) == epochs and len(setup.split.test):
            test = score_test(setup, state, run_dir)
            write_metrics(run_dir, state, test)  # metrics.jsonl ends with the test record
            hooks.on_record(test, "test/")
            if progress:
                print("\n".join(closing_lines(settings, state, test)), flush=True)
        barrier(setup.dist)  # the other ranks wait for rank 0's last evaluation and checkpoint
    finally:
        hooks.close()
        shutdown(setup.dist)
    best = state.best_recall_at_1 if state.best_recall_at_1 >= 0 else None
    return RunResult(run_dir, len(state.history), best, state.history[-1] if state.history else {}, main, test,
                     state.off_the_shelf)


def train_epoch(setup: Setup, epoch: int, run_dir: Path, progress: bool = False) -> dict[str, Any]:
    """One pass over the sampler's batches; its metrics row (mean loss, images/s, learning rate).

    With a trunk cache the batches are cached trunk outputs (one random copy per image), not images.
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
        step = epoch * len(setup.sampler) + steps  # the run's global step, counted from 0
        if step == pause_at:
            _pause(pause_at)
        total += train_step(setup, images, labels, indices)
        seen, steps = seen + len(images) * setup.dist.world_size, steps + 1
        setup.hooks.on_step_end(epoch, step)  # the weight average folds the new weights in
        if steps % config.log_every == 0:
            mean, checked = finite_mean(total, steps, checked, epoch, run_dir), steps
            bar.set_postfix(loss=f"{mean:.4f}", img_s=f"{seen / (time.perf_counter() - t0):.0f}")
    bar.close()
    mean = finite_mean(total, steps, checked, epoch, run_dir)
    return {"epoch": epoch + 1, "loss": mean, "images_per_s": seen / (time.perf_counter() - t0),
            "lr": setup.scheduler.get_last_lr()[0], "world_size": setup.dist.world_size}


def epoch_batches(setup: Setup, seed: int) -> Iterable[tuple[Tensor, Tensor, Tensor]]:
    """(images, labels, indices) of the sampler's batches for its current epoch, as the steps take them: from the
    trunk cache (a copy per image drawn with `seed`) when there is one, else loaded and augmented."""
    if setup.trunk_cache is not None:
        return setup.trunk_cache.batches(setup.sampler, setup.split.train.labels, torch.Generator().manual_seed(seed))
    return DataLoader(setup.dataset, batch_sampler=setup.sampler, num_workers=setup.config.num_workers,
                      pin_memory=setup.device.type == "cuda")


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
        emb = setup.forward(images)
    emb, labels, indices = gather_batch(emb.float(), labels, indices.to(device, non_blocking=cuda), setup.dist)
    mined = setup.sampler.pairs(labels)
    if setup.miner is not None:
        mined = setup.miner(emb.detach(), labels, mined)
    parts = setup.model.member_embeddings(emb)  # an ensemble's members: each its own loss
    loss = sum(setup.criterion(part, labels, mined=mined, weighting=setup.weighting, indices=indices)
               for part in parts)
    loss = setup.hooks.step_loss(loss / len(parts), emb, indices)  # the distillation's pull toward its targets
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
    ones on the validation classes (`selection_score`), or every epoch without validation classes."""
    state.history.append(row)
    write_metrics(run_dir, state)  # rewritten from the checkpoint's history on --resume
    config = setup.config
    plot_training(state.history, run_dir / "training.png",
                  title=f"{config.name}: {config.component('loss')[0]} on {config.dataset}")
    score = selection_score(row)
    earlier = [e for e in map(selection_score, state.history[:-1]) if e is not None]
    improved = setup.split.val is None or score is not None and all(score > e for e in earlier)  # else: the last
    if improved and score is not None:
        state.best_recall_at_1 = score[0]
    checkpoint = {
        **setup.model.checkpoint(), "loss": setup.loss.state_dict(), "optimizer": setup.optimizer.state_dict(),
        "scheduler": setup.scheduler.state_dict(), "scaler": setup.scaler.state_dict(),
        **setup.hooks.checkpoint(),  # the optional parts' state: memory, ema, distill_after
        "epoch": len(state.history), "history": state.history, "best_recall_at_1": state.best_recall_at_1,
        "off_the_shelf": state.off_the_shelf,
        "config": config.model_dump(mode="json"), "class_names": setup.split.test.class_names,
        "data_notes": setup.split.notes,
    }
    if improved:
        save_atomic(checkpoint, run_dir / "best.pt")
    save_atomic(checkpoint, run_dir / "last.pt")


def restore(setup: Setup, run_dir: Path) -> RunState:
    """Load the run's last.pt into the setup's model, loss, hooks and optimisation; what the run had done."""
    state = torch.load(run_dir / "last.pt", map_location="cpu", weights_only=False)
    setup.model.load_state_dict(state["model"])
    setup.loss.load_state_dict(state["loss"])
    setup.hooks.restore(state, run_dir)  # before the optimizer: a distilling run's is the distillation's own
    setup.optimizer.load_state_dict(state["optimizer"])
    setup.scheduler.load_state_dict(state["scheduler"])
    setup.scaler.load_state_dict(state["scaler"])
    return RunState(state["history"], state["best_recall_at_1"], state.get("off_the_shelf"))


def _pause(step: int) -> None:
    """Say that training waits before global step `step` (counted from 0), then wait until a signal ends it."""
    print(f"paused before step {step}", file=sys.stderr, flush=True)
    while True:
        time.sleep(60)


def __getattr__(name: str) -> Any:
    """Deprecated names of what moved out of the loop's module (goes in the next release)."""
    return renamed_attribute(__name__, name, {
        "RESUMABLE_CHANGES": "metricsearch.train.run_dir.RESUMABLE_CHANGES",
        "SAVED_BEFORE": "metricsearch.train.run_dir.SAVED_BEFORE",
        "build_average": "metricsearch.train.setup.build_average",
        "build_memory": "metricsearch.train.setup.build_memory",
    })
