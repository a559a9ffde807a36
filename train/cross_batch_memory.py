"""Cross-batch memory (XBM, Wang et al. 2020): the last embeddings of earlier batches as extra references."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from metricsearch.train.hooks import Hook
from metricsearch.train.losses.base import MetricLoss, Mined
from metricsearch.train.weightings import Weighting


class CrossBatchMemory(nn.Module):
    """A loss whose anchors (the batch) are compared with the batch and the `size` most recent earlier
    embeddings; the bank fills from the first step, and counts from step `start_step` on.

    The bank (embeddings, labels, fill and position) is module state, so checkpoints keep it and a
    resumed run goes on exactly; bank entries are detached (no gradient reaches earlier batches).
    """

    def __init__(self, loss: MetricLoss, size: int, dim: int, start_step: int = 0) -> None:
        super().__init__()
        if not supports_memory(loss):
            raise ValueError(f"loss {type(loss).__name__} cannot use a cross-batch memory; "
                             "use loss ms (or ms_weighting), or set memory.size: 0")
        if size < 1:
            raise ValueError(f"memory size must be at least 1, got {size}")
        self.loss, self.size, self.start_step = loss, size, start_step
        self.register_buffer("bank", torch.zeros(size, dim))
        self.register_buffer("bank_labels", torch.zeros(size, dtype=torch.long))
        self.register_buffer("filled", torch.zeros((), dtype=torch.long))
        self.register_buffer("position", torch.zeros((), dtype=torch.long))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, embeddings: Tensor, labels: Tensor, mined: Mined | None = None,
                weighting: Weighting | None = None, indices: Tensor | None = None) -> Tensor:
        """The batch loss, against the batch and the bank once `start_step` steps have passed; then the
        batch joins the bank."""
        filled = int(self.filled)
        if int(self.steps) >= self.start_step and filled > 0:
            loss = self.loss.loss_against(embeddings, labels, self.bank[:filled], self.bank_labels[:filled])
        else:
            loss = self.loss(embeddings, labels, mined=mined, weighting=weighting, indices=indices)
        self.enqueue(embeddings.detach(), labels)
        self.steps += 1
        return loss

    @torch.no_grad()
    def enqueue(self, embeddings: Tensor, labels: Tensor) -> None:
        """Write a batch over the oldest entries of the bank (a ring buffer)."""
        embeddings, labels = embeddings[-self.size:], labels[-self.size:]
        slots = (int(self.position) + torch.arange(len(labels), device=labels.device)) % self.size
        self.bank[slots] = embeddings.to(self.bank.dtype)
        self.bank_labels[slots] = labels
        self.position.copy_((self.position + len(labels)) % self.size)
        self.filled.clamp_(min=min(self.size, int(self.filled) + len(labels)))


def supports_memory(loss: MetricLoss) -> bool:
    """Whether `loss` can take references beyond the batch (it implements `loss_against`)."""
    return type(loss).loss_against is not MetricLoss.loss_against


class MemoryHook(Hook):
    """The `memory` section in a run: the steps call the memory in place of the loss (the setup's `criterion`); its
    bank goes into each checkpoint (`memory`) and comes back on resume."""

    def __init__(self, memory: CrossBatchMemory) -> None:
        self.memory = memory

    def restore(self, checkpoint: dict[str, Any], run_dir: Path) -> None:
        self.memory.load_state_dict(checkpoint["memory"])

    def checkpoint(self) -> dict[str, Any]:
        return {"memory": self.memory.state_dict()}
