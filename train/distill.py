"""Distillation (config `distill`): after a run's own epochs, more epochs whose loss also pulls each training image's
embedding toward a fixed target, the mean of its test-time views' embeddings when they began."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metricsearch.data import ImageSet
from metricsearch.models.torch_embedder import Embedder
from metricsearch.train.config import TrainConfig
from metricsearch.train.hooks import Hook
from metricsearch.train.optim import build_optimizer, build_schedule
from metricsearch.train.run_dir import save_atomic
from metricsearch.train.whitening import Views, own_embeddings

#: the targets of a run's distillation epochs, in its run directory (a resumed distillation needs them)
TARGETS_FILE = "distill_targets.pt"


def distance_to_targets(embeddings: Tensor, targets: Tensor) -> Tensor:
    """The mean over rows of 1 - the cosine similarity of each embedding and its target."""
    return (1 - F.cosine_similarity(embeddings, targets, dim=1)).mean()


def view_targets(model: Embedder, images: ImageSet, batch_size: int = 64,
                 views: Views | None = None) -> Tensor:
    """Each image's L2-normalised embedding with the model's test-time shifts and rotations (or these `views`:
    shifts, rotations), without its whitening or symmetric copies (N x part_dim float32, on the CPU); the model is
    left as it was. `batch_size` images (each with its views) are embedded at once: 64 keeps a training batch's
    memory."""
    return F.normalize(torch.from_numpy(own_embeddings(model, images, batch_size, views)).float(), dim=1)


def distill_optimization(
    config: TrainConfig, model: Embedder, loss: nn.Module, steps_per_epoch: int,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """A fresh optimizer (the config's, every group at `distill.lr`) and its cosine schedule over the distillation."""
    section = {**config.optimizer, "lr": config.distill.lr, "head_lr": config.distill.lr}
    optimizer = build_optimizer(section, model, loss)
    return optimizer, build_schedule({"name": "cosine"}, optimizer, steps_per_epoch, config.distill.epochs)


class Optimized(Protocol):
    """What holds a run's optimizer and schedule (the trainer's Setup); the distillation replaces both."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR


class DistillHook(Hook):
    """The `distill` section in a run: when its own epochs end, a fresh optimizer and schedule (`distill_optimization`)
    and each training image's target (`view_targets`, kept in RUN_DIR/distill_targets.pt by the rank that `write`s);
    from then on each step's loss also pulls the embeddings toward their targets, and each row says `phase: distill`."""

    def __init__(self, config: TrainConfig, training: Optimized, model: Embedder, loss: nn.Module, images: ImageSet,
                 device: torch.device, steps_per_epoch: int, write: bool = True) -> None:
        self.config, self.training, self.model, self.loss = config, training, model, loss
        self.images, self.device, self.steps_per_epoch, self.write = images, device, steps_per_epoch, write
        self.targets: Tensor | None = None  # each training image's target embedding, on the device, once distilling
        self.run_dir: Path | None = None

    def restore(self, checkpoint: dict[str, Any], run_dir: Path) -> None:
        own, done = self.config.epochs, len(checkpoint["history"])
        after = checkpoint.get("distill_after")  # the run's own epochs, once it distils
        if (after is not None and after != own) or (after is None and done > own and self.config.distill.epochs):
            raise ValueError(f"--resume: the run trained {after or done} epochs of its own, which its distillation "
                             f"follows; set epochs: {after or done}")
        if after is not None:
            targets = run_dir / TARGETS_FILE
            if not targets.is_file():
                raise FileNotFoundError(f"--resume: {targets}, the distillation's targets, is gone; train the run "
                                        "again (--overwrite)")
            self.start(torch.load(targets, map_location="cpu", weights_only=True))

    def on_run_start(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def on_epoch_start(self, epoch: int) -> None:
        if epoch == self.config.epochs:
            self.start()

    def start(self, targets: Tensor | None = None) -> None:
        """Turn to the distillation: a fresh optimizer and schedule, and the `targets` given (a resumed run's), else
        those of the model as it is now."""
        config = self.config
        self.training.optimizer, self.training.scheduler = distill_optimization(config, self.model, self.loss,
                                                                                self.steps_per_epoch)
        if targets is None:
            targets = view_targets(self.model, self.images, views=config.distill.views(config.model))
            if self.write:
                save_atomic(targets, self.run_dir / TARGETS_FILE)
        self.targets = targets.to(self.device)

    def step_loss(self, loss: Tensor, embeddings: Tensor, indices: Tensor) -> Tensor:
        if self.targets is None:
            return loss
        return loss + self.config.distill.weight * distance_to_targets(embeddings, self.targets[indices])

    def on_epoch_end(self, epoch: int, row: dict[str, Any]) -> None:
        if self.targets is not None:
            row["phase"] = "distill"

    def checkpoint(self) -> dict[str, Any]:
        return {"distill_after": self.config.epochs} if self.targets is not None else {}  # the run's own epochs
