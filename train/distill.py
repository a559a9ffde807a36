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

#: the targets of a run's distillation epochs, in its run directory (a resumed distillation needs them)
TARGETS_FILE = "distill_targets.pt"


def distance_to_targets(embeddings: Tensor, targets: Tensor) -> Tensor:
    """The mean over rows of 1 - the cosine similarity of each embedding and its target."""
    return (1 - F.cosine_similarity(embeddings, targets, dim=1)).mean()


@torch.no_grad()
def view_targets(model: Embedder, images: ImageSet, batch_size: int = 256) -> Tensor:
    """Each image's L2-normalised embedding with the model's test-time shifts and rotations, without its whitening or
    symmetric copies (N x part_dim float32, on the CPU); the model is left as it was."""
    whitening = model.whitening.clone() if model.whiten else None
    symmetries = model.tta_symmetries
    try:
        if whitening is not None:
            model.set_whitening(torch.eye(model.part_dim))
        model.set_views(model.tta_shifts, model.tta_rotations)
        embeddings = torch.from_numpy(model.embed_set(images, batch_size=batch_size))
    finally:
        model.set_views(model.tta_shifts, model.tta_rotations, symmetries)
        if whitening is not None:
            model.set_whitening(whitening)
    return F.normalize(embeddings.float(), dim=1)


def distill_optimization(
    config: TrainConfig, model: Embedder, loss: nn.Module, steps_per_epoch: int,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """A fresh optimizer (the config's, every group at `distill.lr`) and its cosine schedule over the distillation."""
    section = {**config.optimizer, "lr": config.distill.lr, "head_lr": config.distill.lr}
    optimizer = build_optimizer(section, model, loss)
    return optimizer, build_schedule({"name": "cosine"}, optimizer, steps_per_epoch, config.distill.epochs)
