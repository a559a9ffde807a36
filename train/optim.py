"""Optimizers and learning-rate schedules, each chosen by name from its registry like the losses."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch
from torch import nn

from metricsearch.models.torch_embedder import Embedder
from metricsearch.registry import Registry

#: a learning-rate schedule: optimizer step -> factor of the base learning rates
Schedule = Callable[[int], float]
ParamGroups = Iterable[dict[str, Any]]

OPTIMIZERS: Registry[torch.optim.Optimizer] = Registry("optimizer")
SCHEDULES: Registry[Schedule] = Registry("schedule")

# torch's own classes, whose parameters (betas, eps, weight_decay, fused, ...) the config may set
OPTIMIZERS.register("adamw")(torch.optim.AdamW)
OPTIMIZERS.register("adam")(torch.optim.Adam)


@OPTIMIZERS.register("sgd")
def sgd(
    params: ParamGroups, lr: float, momentum: float = 0.9, weight_decay: float = 0.0, nesterov: bool = False,
) -> torch.optim.Optimizer:
    """SGD with momentum."""
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)


def build_optimizer(section: dict[str, Any], model: Embedder, loss: nn.Module) -> torch.optim.Optimizer:
    """The optimizer of an `optimizer` section: backbone at `lr` (its frozen trunk left out), head at `head_lr`, then
    the loss's parameters."""
    params = dict(section)
    name = params.pop("name")
    lr = float(params.pop("lr"))
    head_lr = float(params.pop("head_lr", lr))
    groups = [{"params": [p for p in model.backbone.parameters() if p.requires_grad], "lr": lr},
              {"params": list(model.head.parameters()), "lr": head_lr}]
    if hasattr(loss, "param_groups"):
        groups += loss.param_groups(lr)
    elif any(p.requires_grad for p in loss.parameters()):
        groups.append({"params": list(loss.parameters()), "lr": lr})
    return OPTIMIZERS.build(name, None, params=groups, lr=lr, **params)


def warmed_up(decay: Schedule, warmup_steps: int) -> Schedule:
    """`decay` (counted from the end of the warm-up) after a linear warm-up over `warmup_steps`."""

    def factor(step: int) -> float:
        return (step + 1) / warmup_steps if step < warmup_steps else decay(step - warmup_steps)

    return factor


@SCHEDULES.register("cosine")
def cosine(steps_per_epoch: int, epochs: int, warmup_epochs: float = 0, min_factor: float = 0.01) -> Schedule:
    """Linear warm-up, then a cosine decay from 1 to `min_factor` over the remaining steps."""
    warmup = int(float(warmup_epochs) * steps_per_epoch)
    span = max(1, max(1, steps_per_epoch * epochs) - warmup)
    floor = float(min_factor)
    return warmed_up(lambda k: floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(k / span, 1.0))), warmup)


@SCHEDULES.register("step")
def step(
    steps_per_epoch: int, epochs: int, warmup_epochs: float = 0, every_epochs: int | None = None, gamma: float = 0.1,
) -> Schedule:
    """Linear warm-up, then the rate times `gamma` every `every_epochs` (default: a third of the epochs)."""
    warmup = int(float(warmup_epochs) * steps_per_epoch)
    every = int(every_epochs if every_epochs is not None else max(1, epochs // 3)) * steps_per_epoch
    gamma = float(gamma)
    return warmed_up(lambda k: gamma ** (k // every), warmup)


@SCHEDULES.register("constant")
def constant(steps_per_epoch: int, epochs: int, warmup_epochs: float = 0) -> Schedule:
    """Linear warm-up, then the base rate."""
    return warmed_up(lambda k: 1.0, int(float(warmup_epochs) * steps_per_epoch))


def build_schedule(
    section: dict[str, Any], optimizer: torch.optim.Optimizer, steps_per_epoch: int, epochs: int,
) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning-rate scheduler of a `schedule` section, stepped once per optimizer step."""
    params = dict(section)
    name = params.pop("name")
    factor = SCHEDULES.build(name, None, steps_per_epoch=steps_per_epoch, epochs=epochs, **params)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
