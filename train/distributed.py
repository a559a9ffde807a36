"""Multi-process training under torchrun: the process group, the global batch, and rank 0's duties.

`torchrun --nproc_per_node=N -m metricsearch train ...` starts N processes with RANK, WORLD_SIZE
and LOCAL_RANK set. Each rank embeds its own share of the batch; embeddings, labels and data
set indices are all-gathered before the loss, so every pair loss, miner and weighting sees the
global batch. Gradients flow only through each rank's own rows, and DistributedDataParallel
sums (not averages) the ranks' gradients, so a step equals the single-process step on the
global batch. The loss's own parameters (proxies, learned betas) are replicated, not split:
every rank computes their whole gradient from the global batch, and `average_gradients` keeps
the copies identical.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn


@dataclass(frozen=True)
class DistContext:
    """Where this process stands: its rank among `world_size` processes (1: not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Whether this process evaluates and writes checkpoints, metrics and plots (rank 0)."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        """Whether there are several processes."""
        return self.world_size > 1


def select_backend(device_type: str) -> str:
    """The collective backend for a device type: NCCL on CUDA GPUs, gloo on the CPU."""
    return "nccl" if device_type == "cuda" else "gloo"


def context_from_env(env: dict[str, str] | None = None) -> DistContext:
    """The DistContext that torchrun's RANK / WORLD_SIZE / LOCAL_RANK variables describe."""
    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE", "1"))
    rank, local = int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", env.get("RANK", "0")))
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"bad torchrun environment: RANK={rank}, WORLD_SIZE={world}")
    return DistContext(rank, world, local)


def init_distributed(device: torch.device, ctx: DistContext | None = None) -> tuple[DistContext, torch.device]:
    """Join the process group when torchrun started several processes; each CUDA rank gets its own GPU."""
    ctx = ctx or context_from_env()
    if not ctx.active:
        return ctx, device
    if device.type == "cuda":
        device = torch.device("cuda", ctx.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(select_backend(device.type), rank=ctx.rank, world_size=ctx.world_size)
    return ctx, device


def _sum_gradients(process_group, bucket):  # no annotations: DDP checks them, and they are strings here
    """DDP communication hook: all-reduce the gradients by sum (DDP's default divides by world size)."""
    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def wrap_model(model: nn.Module, ctx: DistContext, device: torch.device) -> nn.Module:
    """The model in DistributedDataParallel with summed gradients when distributed, else itself."""
    if not ctx.active:
        return model
    ids = [device.index] if device.type == "cuda" else None
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    ddp.register_comm_hook(None, _sum_gradients)
    return ddp


def gather_rows(x: Tensor, ctx: DistContext) -> Tensor:
    """All ranks' rows of `x` concatenated in rank order; gradients flow through this rank's own rows."""
    if not ctx.active:
        return x
    sizes = [torch.zeros(1, dtype=torch.long, device=x.device) for _ in range(ctx.world_size)]
    dist.all_gather(sizes, torch.tensor([x.shape[0]], device=x.device))
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros((longest, *x.shape[1:]), dtype=x.dtype, device=x.device)
    padded[: x.shape[0]] = x.detach()
    parts = [torch.empty_like(padded) for _ in range(ctx.world_size)]
    dist.all_gather(parts, padded)
    rows = [p[: int(s.item())] for p, s in zip(parts, sizes)]
    rows[ctx.rank] = x
    return torch.cat(rows)


def gather_batch(embeddings: Tensor, labels: Tensor, indices: Tensor,
                 ctx: DistContext) -> tuple[Tensor, Tensor, Tensor]:
    """The global batch: embeddings (with this rank's gradients), labels and data set indices of every rank."""
    return gather_rows(embeddings, ctx), gather_rows(labels, ctx), gather_rows(indices, ctx)


def average_gradients(module: nn.Module, ctx: DistContext) -> None:
    """Replace the gradients of a module that every rank holds whole (the loss's proxies or learned betas, outside
    DistributedDataParallel) by their mean over the ranks: each rank computed them from the same global batch, so
    the mean is the single-process gradient, and the copies stay identical however the ranks rounded."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not ctx.active or not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= ctx.world_size
    for grad, mean in zip(grads, flat.split([g.numel() for g in grads])):
        grad.copy_(mean.view_as(grad))


def barrier(ctx: DistContext) -> None:
    """Wait until every rank gets here (a no-op when not distributed)."""
    if ctx.active:
        dist.barrier()


def shutdown(ctx: DistContext) -> None:
    """Leave the process group (a no-op when not distributed)."""
    if ctx.active and dist.is_initialized():
        dist.destroy_process_group()
