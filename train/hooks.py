"""The hook contract: the optional parts of a training run (EMA, distillation, cross-batch memory, TensorBoard) as
objects the training loop calls at fixed moments; each moment does nothing unless the part overrides it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from torch import Tensor


class Hook:
    """An optional part of training; `train/trainer.py`'s loop calls every hook of the run at each moment below, in
    the order the hooks were built (`train/setup.py`)."""

    def restore(self, checkpoint: dict[str, Any], run_dir: Path) -> None:
        """Resuming: take back this part's state from the run's last.pt (`checkpoint`), before the optimizer's."""

    def on_run_start(self, run_dir: Path) -> None:
        """The run directory is ready (and a resumed run restored), before the first epoch of this call."""

    def on_epoch_start(self, epoch: int) -> None:
        """Epoch `epoch` (counted from 0) begins."""

    def step_loss(self, loss: Tensor, embeddings: Tensor, indices: Tensor) -> Tensor:
        """The step's loss with this part's term added (`embeddings` of the images `indices`, gathered)."""
        return loss

    def on_step_end(self, epoch: int, step: int) -> None:
        """The optimizer took global step `step` (counted from 0) of epoch `epoch`."""

    def on_epoch_end(self, epoch: int, row: dict[str, Any]) -> None:
        """The epoch's steps are done, `row` its metrics so far; before the whitening, the evaluation and the save."""

    def on_evaluated(self, epoch: int) -> None:
        """The model was evaluated on the validation classes after epoch `epoch` (rank 0 only)."""

    def on_record(self, record: dict[str, Any], prefix: str = "") -> None:
        """A record joined metrics.jsonl: an epoch's row, or, under `prefix`, the off-the-shelf or the test record
        (rank 0 only)."""

    def checkpoint(self) -> dict[str, Any]:
        """This part's entries of each checkpoint."""
        return {}

    def close(self) -> None:
        """The run ends, finished or not."""


class Hooks(Hook):
    """A run's hooks as one: each moment calls every hook in order (each step's loss passes through them all)."""

    def __init__(self, hooks: Iterable[Hook] = ()) -> None:
        self.hooks = list(hooks)

    def restore(self, checkpoint: dict[str, Any], run_dir: Path) -> None:
        for hook in self.hooks:
            hook.restore(checkpoint, run_dir)

    def on_run_start(self, run_dir: Path) -> None:
        for hook in self.hooks:
            hook.on_run_start(run_dir)

    def on_epoch_start(self, epoch: int) -> None:
        for hook in self.hooks:
            hook.on_epoch_start(epoch)

    def step_loss(self, loss: Tensor, embeddings: Tensor, indices: Tensor) -> Tensor:
        for hook in self.hooks:
            loss = hook.step_loss(loss, embeddings, indices)
        return loss

    def on_step_end(self, epoch: int, step: int) -> None:
        for hook in self.hooks:
            hook.on_step_end(epoch, step)

    def on_epoch_end(self, epoch: int, row: dict[str, Any]) -> None:
        for hook in self.hooks:
            hook.on_epoch_end(epoch, row)

    def on_evaluated(self, epoch: int) -> None:
        for hook in self.hooks:
            hook.on_evaluated(epoch)

    def on_record(self, record: dict[str, Any], prefix: str = "") -> None:
        for hook in self.hooks:
            hook.on_record(record, prefix)

    def checkpoint(self) -> dict[str, Any]:
        return {key: value for hook in self.hooks for key, value in hook.checkpoint().items()}

    def close(self) -> None:
        for hook in self.hooks:
            hook.close()
