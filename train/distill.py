"""Distillation (config `distill`): after a run's own epochs, more epochs whose loss also pulls each training image's
embedding toward a fixed target, the mean of its test-time views' embeddings when they began."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metricsearch.data import ImageSet
from metricsearch.models.torch_embedder import Embedder
from metricsearch.train.config import TrainConfig
from metricsearch.train.optim import build_optimizer, build_schedule
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
