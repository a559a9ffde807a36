"""Weight averaging (config `ema`): an exponential moving average of the weights over a run's own epochs, which
takes the weights' place when those epochs end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from metricsearch.train.hooks import Hook


class WeightAverage:
    """The exponential moving average of a model's floating-point weights and buffers (batch-norm statistics) from
    step `start_step` on, where it starts as the weights of then; each later step weighs the new weights by
    1 / `span_steps`.

    Its state is a checkpoint's, so a resumed run goes on exactly.
    """

    def __init__(self, model: nn.Module, span_steps: float, start_step: int = 0) -> None:
        if span_steps < 1:
            raise ValueError(f"the average spans at least one step, got {span_steps:g}")
        self.start_step = start_step
        self.average = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(1.0 - 1.0 / span_steps),
                                     use_buffers=True)

    def update(self, model: nn.Module, step: int) -> None:
        """Fold the model's weights after global step `step` (counted from 0) into the average, from `start_step`."""
        if step >= self.start_step:
            self.average.update_parameters(model)

    def apply(self, model: nn.Module) -> None:
        """Put the average in place of the model's floating-point weights and buffers (its counters stay)."""
        if int(self.average.n_averaged) == 0:
            return  # no step reached start_step: the weights are their own average
        own, averaged = model.state_dict(), self.average.module.state_dict()
        model.load_state_dict({k: averaged[k] if v.is_floating_point() else v for k, v in own.items()})

    def state_dict(self) -> dict[str, Any]:
        """The average and how many steps it holds, for a checkpoint."""
        return self.average.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` gave."""
        self.average.load_state_dict(state)


class EmaHook(Hook):
    """The `ema` section in a run: the average folds in the weights after each step of the run's own `epochs`,
    takes their place when those epochs end, and is kept in each checkpoint (`ema`)."""

    def __init__(self, model: nn.Module, average: WeightAverage, epochs: int) -> None:
        self.model, self.average, self.epochs = model, average, epochs

    def restore(self, checkpoint: dict[str, Any], run_dir: Path) -> None:
        self.average.load_state_dict(checkpoint["ema"])

    def on_step_end(self, epoch: int, step: int) -> None:
        if epoch < self.epochs:
            self.average.update(self.model, step)

    def on_epoch_end(self, epoch: int, row: dict[str, Any]) -> None:
        if epoch + 1 == self.epochs:
            self.average.apply(self.model)

    def checkpoint(self) -> dict[str, Any]:
        return {"ema": self.average.state_dict()}
