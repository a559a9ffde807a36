"""Uniformly random mining: a random subset of the pairs or of the triplets."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from metricsearch.train.losses.base import Mined
from metricsearch.train.miners.base import SeededMiner, empty_triplets, row_table
from metricsearch.train.miners.registry import register_miner


@register_miner("random")
class RandomMiner(SeededMiner):
    """A uniformly random subset (a `fraction`, rounded up) of the pairs or of the triplets."""

    def __init__(self, fraction: float = 0.5, produces: str = "pairs", seed: int = 0) -> None:
        super().__init__(seed)
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        if produces not in ("pairs", "triplets"):
            raise ValueError(f"produces must be 'pairs' or 'triplets', got {produces!r}")
        self.fraction = fraction
        self.produces = produces  # type: ignore[misc]  # per instance: this miner does either

    def subset(self, total: int, device: torch.device) -> Tensor:
        """Sorted flat indices of a uniform random subset of ceil(fraction * total) of `total` items."""
        keep = math.ceil(self.fraction * total)
        return torch.randperm(total, generator=self.generator(device), device=device)[:keep].sort().values

    def mine(self, sim: Tensor, pos: Tensor, neg: Tensor, dim: int) -> Mined:
        if self.produces == "pairs":
            candidates = (pos | neg).flatten().nonzero(as_tuple=True)[0]
            chosen = torch.zeros_like(pos).flatten()
            chosen[candidates[self.subset(len(candidates), sim.device)]] = True
            chosen = chosen.view_as(pos)
            return Mined(pos=pos & chosen, neg=neg & chosen)
        # triplet t of anchor a is (a, r // |N_a|-th positive, r % |N_a|-th negative), r its rank
        n_pos, n_neg = pos.sum(dim=1), neg.sum(dim=1)
        per_anchor = n_pos * n_neg
        ends = per_anchor.cumsum(0)
        if int(ends[-1]) == 0:
            return empty_triplets(sim.device)
        flat = self.subset(int(ends[-1]), sim.device)
        anchor = torch.searchsorted(ends, flat, right=True)
        rank = flat - (ends - per_anchor)[anchor]
        pos_idx, _ = row_table(pos)
        neg_idx, _ = row_table(neg)
        positive = pos_idx[anchor, rank // n_neg[anchor]]
        negative = neg_idx[anchor, rank % n_neg[anchor]]
        return Mined(triplets=(anchor, positive, negative))
