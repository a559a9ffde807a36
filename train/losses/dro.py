"""The dro_* losses (Qi et al., DRO framework): a base pair loss whose mean over pairs is replaced by a DRO
weighting (train/weightings/dro.py: TopK, TopK-PN, KL)."""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor

from metricsearch.train.context import TrainContext
from metricsearch.train.losses.base import PairLoss
from metricsearch.train.losses.registry import LOSSES, register
from metricsearch.train.weightings.base import Weighting
from metricsearch.train.weightings.dro import KLWeighting, TopKPNWeighting, TopKWeighting


class SimilarityMarginLoss(PairLoss):
    """The DRO paper's base pair loss `[a + y_ij (lam - S_ij)]_+`, y = +1 positive, -1 negative.

    The paper gives no values; margin a = 0.1 and lam = 0.5 ask for S >= 0.6 on positives and
    S <= 0.4 on negatives.
    """

    def __init__(self, margin: float = 0.1, lam: float = 0.5) -> None:
        super().__init__()
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        self.margin, self.lam = margin, lam

    def pair_losses(
        self, sim: Tensor, labels: Tensor, pos: Tensor, neg: Tensor, indices: Tensor | None = None
    ) -> Tensor:
        y = pos.to(sim.dtype) * 2.0 - 1.0
        return F.relu(self.margin + y * (self.lam - sim))


def build_base(base: str | None, base_params: dict[str, Any] | None, context: TrainContext | None) -> PairLoss:
    """The base pair loss of a DRO loss: the paper's margin loss (None) or a registered pair loss, given the
    training context as any loss is."""
    params = dict(base_params or {})
    if base is None:
        return SimilarityMarginLoss(**params)
    if base not in LOSSES.names():
        raise ValueError(
            f"base must name a registered pair loss, got {base!r}; known: {LOSSES.names()}"
        )
    loss = LOSSES.build(base, context.as_dict() if context is not None else None, **params)
    if not isinstance(loss, PairLoss):
        raise ValueError(f"base must be a pair loss, {base!r} is not")
    return loss


class DROLoss(PairLoss):
    """A base pair loss whose own weighting (the mean over pairs) is replaced by a DRO weighting."""

    def __init__(
        self,
        weighting: Weighting,
        base: str | None = None,
        base_params: dict[str, Any] | None = None,
        context: TrainContext | None = None,
    ) -> None:
        super().__init__()
        self.weighting = weighting
        self.base = build_base(base, base_params, context)
        self.normalize = self.base.normalize

    def pair_losses(
        self, sim: Tensor, labels: Tensor, pos: Tensor, neg: Tensor, indices: Tensor | None = None
    ) -> Tensor:
        return self.base.pair_losses(sim, labels, pos, neg, indices)

    def weigh(
        self, losses: Tensor, pos: Tensor, neg: Tensor, labels: Tensor, indices: Tensor | None = None
    ) -> Tensor:
        """The DRO weighting of the pair losses."""
        return self.weighting(losses, pos, neg, labels)


@register("dro_topk")
class DROTopKLoss(DROLoss):
    """The DRO-TopK loss: a base pair loss, weighted by TopKWeighting (the mean of its K largest pair losses)."""

    def __init__(self, k: int = 100, base: str | None = None, base_params: dict[str, Any] | None = None,
                 context: TrainContext | None = None) -> None:
        super().__init__(TopKWeighting(k), base, base_params, context)


@register("dro_topk_pn")
class DROTopKPNLoss(DROLoss):
    """The DRO-TopK-PN loss: a base pair loss, weighted by TopKPNWeighting (its K/2 largest positive and negative)."""

    def __init__(self, k: int = 100, base: str | None = None, base_params: dict[str, Any] | None = None,
                 context: TrainContext | None = None) -> None:
        super().__init__(TopKPNWeighting(k), base, base_params, context)


@register("dro_kl")
class DROKLLoss(DROLoss):
    """The DRO-KL loss: a base pair loss, weighted by KLWeighting (`gamma * log mean exp(l / gamma)` of its pairs)."""

    def __init__(self, gamma: float = 0.1, base: str | None = None, base_params: dict[str, Any] | None = None,
                 context: TrainContext | None = None) -> None:
        super().__init__(KLWeighting(gamma), base, base_params, context)

