"""Deterministic and uniform-random miners: semi-hard, hard, batch-hard, MS pair mining, random.

Every miner is called as `miner(embeddings, labels, mined=None) -> Mined`, L2-normalises the
embeddings itself, only considers the pairs of `mined` when given, and says in `produces`
whether it returns pair masks ("pairs") or (anchor, positive, negative) triplets ("triplets").
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from metricsearch.train.losses.base import Mined, check_inputs, distances_from_similarity, pair_masks
from metricsearch.train.losses.ms import ms_mine
from metricsearch.train.sampling.registry import register_miner


def normalized_similarity(embeddings: Tensor) -> Tensor:
    """B x B cosine similarities of the L2-normalised embeddings (no gradient)."""
    emb = F.normalize(embeddings.detach().float(), dim=1)
    return emb @ emb.t()


def row_table(mask: Tensor) -> tuple[Tensor, Tensor]:
    """Per row, the column indices where `mask` holds, left-aligned in a B x K table, and its validity."""
    counts = mask.sum(dim=1)
    width = int(counts.max()) if mask.numel() else 0
    order = torch.sort(mask.to(torch.uint8), dim=1, descending=True, stable=True).indices
    valid = torch.arange(width, device=mask.device)[None, :] < counts[:, None]
    return order[:, :width], valid


class Miner:
    """Base of every miner: input checks, normalised distances, label masks restricted to `mined`."""

    produces: ClassVar[str] = "triplets"

    def __call__(self, embeddings: Tensor, labels: Tensor, mined: Mined | None = None) -> Mined:
        check_inputs(embeddings, labels)
        sim = normalized_similarity(embeddings)
        pos, neg = pair_masks(labels, mined)
        return self.mine(sim, pos, neg, embeddings.shape[1])

    def mine(self, sim: Tensor, pos: Tensor, neg: Tensor, dim: int) -> Mined:
        """Select from the candidate pairs given their similarities (`dim`: the embedding size)."""
        raise NotImplementedError


class SeededMiner(Miner):
    """A miner that draws from its own seeded torch.Generator (one per device)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def generator(self, device: torch.device) -> torch.Generator:
        """The miner's generator on `device`, seeded on first use."""
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[device]


def empty_triplets(device: torch.device) -> Mined:
    """A Mined with no triplets."""
    empty = torch.zeros(0, dtype=torch.long, device=device)
    return Mined(triplets=(empty, empty.clone(), empty.clone()))


def triplets_as_pairs(triplets: tuple[Tensor, Tensor, Tensor], like: Tensor) -> Mined:
    """Pair masks (B x B, shaped as `like`) of the (a, p) and (a, n) pairs of some triplets."""
    anchor, positive, negative = triplets
    pos, neg = torch.zeros_like(like), torch.zeros_like(like)
    pos[anchor, positive] = True
    neg[anchor, negative] = True
    return Mined(pos=pos, neg=neg)


@register_miner("semihard")
class SemiHardMiner(Miner):
    """FaceNet semi-hard: per (a, p) the closest negative with D_an > D_ap (and D_an < D_ap + margin)."""

    def __init__(self, margin: float | None = None) -> None:
        if margin is not None and margin <= 0:
            raise ValueError(f"margin must be positive or None, got {margin}")
        self.margin = margin

    def mine(self, sim: Tensor, pos: Tensor, neg: Tensor, dim: int) -> Mined:
        dist = distances_from_similarity(sim)
        pos_idx, pos_ok = row_table(pos)
        d_ap = dist.gather(1, pos_idx)
        # negatives of each anchor sorted by distance, non-negatives pushed to +inf at the end
        neg_sorted, neg_order = dist.masked_fill(~neg, float("inf")).sort(dim=1)
        first = torch.searchsorted(neg_sorted, d_ap.contiguous(), right=True)  # first D_an > D_ap
        ok = pos_ok & (first < neg.sum(dim=1, keepdim=True))
        first = first.clamp(max=dist.shape[1] - 1)
        if self.margin is not None:
            ok &= neg_sorted.gather(1, first) < d_ap + self.margin
        anchor = torch.arange(dist.shape[0], device=dist.device)[:, None].expand_as(pos_idx)
        return Mined(triplets=(anchor[ok], pos_idx[ok], neg_order.gather(1, first)[ok]))


@register_miner("hard")
class HardMiner(Miner):
    """Hard negative mining: per (a, p) the negative closest to the anchor."""

    def mine(self, sim: Tensor, pos: Tensor, neg: Tensor, dim: int) -> Mined:
        closest = sim.masked_fill(~neg, -math.inf).argmax(dim=1)  # highest similarity = closest
        anchor, positive = (pos & neg.any(dim=1, keepdim=True)).nonzero(as_tuple=True)
        return Mined(triplets=(anchor, positive, closest[anchor]))


@register_miner("batch_hard")
class BatchHardMiner(Miner):
    """Batch-hard mining: per anchor the farthest positive and the closest negative."""

    def mine(self, sim: Tensor, pos: Tensor, neg: Tensor, dim: int) -> Mined:
        anchor = (pos.any(dim=1) & neg.any(dim=1)).nonzero(as_tuple=True)[0]
        farthest = sim.masked_fill(~pos, math.inf).argmin(dim=1)
        closest = sim.masked_fill(~neg, -math.inf).argmax(dim=1)
        return Mined(triplets=(anchor, farthest[anchor], closest[anchor]))


@register_miner("ms")
class MSMiner(Miner):
    """The multi-similarity mining step (`ms_mine`) as a pair miner for any pair loss."""

    produces: ClassVar[str] = "pairs"

    def __init__(self, epsilon: float = 0.1) -> None:
        if epsilon < 0:
            raise ValueError(f"epsilon must be >= 0, got {epsilon}")
        self.epsilon = epsilon

    def mine(self, sim: Tensor, pos: Tensor, neg: Tensor, dim: int) -> Mined:
        kept_pos, kept_neg = ms_mine(sim, pos, neg, self.epsilon)
        return Mined(pos=kept_pos, neg=kept_neg)


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
