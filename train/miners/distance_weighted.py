"""Distance weighted sampling (Wu et al. 2017, "Sampling matters", section 4)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from metricsearch.train.losses.base import Mined, check_inputs, distances_from_similarity, pair_masks
from metricsearch.train.miners.registry import register_miner
from metricsearch.train.miners.base import (
    SeededMiner, empty_triplets, normalized_similarity, row_table, triplets_as_pairs,
)


def log_sphere_distance_density(d: Tensor, dim: int) -> Tensor:
    """log q(d): density of the distance between two points uniform on the unit sphere in R^dim,
    q(d) = d^(dim-2) (1 - d^2/4)^((dim-3)/2) / B(1/2, (dim-1)/2), normalised on [0, 2]."""
    log_beta = math.lgamma(0.5) + math.lgamma((dim - 1) / 2) - math.lgamma(dim / 2)
    return (dim - 2) * torch.log(d) + (dim - 3) / 2 * torch.log1p(-0.25 * d * d) - log_beta


@register_miner("distance_weighted")
class DistanceWeightedMiner(SeededMiner):
    """Per positive pair (a, p) one negative drawn with Pr(n | a) proportional to min(lam, 1/q(D_an)).

    D_an is clipped below at `cutoff`; negatives with D_an >= `nonzero_loss_cutoff` are never drawn
    (anchors with no eligible negative give no triplet). q is the normalised density of
    `log_sphere_distance_density`, so `lam` is in the units of 1/q; the default (no clipping)
    matches the paper's released code and PML's DistanceWeightedMiner. With produces="pairs" the
    draws come back as pair masks (the positive pairs and the drawn negative pairs) for pair
    losses such as the margin loss, as the paper uses them.
    """

    def __init__(
        self, cutoff: float = 0.5, nonzero_loss_cutoff: float = 1.4, lam: float = math.inf,
        produces: str = "triplets", seed: int = 0,
    ) -> None:
        super().__init__(seed)
        if produces not in ("pairs", "triplets"):
            raise ValueError(f"produces must be 'pairs' or 'triplets', got {produces!r}")
        self.produces = produces  # type: ignore[misc]  # per instance: this miner does either
        if not 0 < cutoff < nonzero_loss_cutoff:
            raise ValueError(
                f"need 0 < cutoff < nonzero_loss_cutoff, got {cutoff} and {nonzero_loss_cutoff}"
            )
        if lam <= 0:
            raise ValueError(f"lam must be positive, got {lam}")
        self.cutoff, self.nonzero_loss_cutoff, self.lam = cutoff, nonzero_loss_cutoff, lam

    def probabilities(self, embeddings: Tensor, labels: Tensor, mined: Mined | None = None) -> Tensor:
        """B x B matrix: row a is the distribution over negatives n the miner draws from for anchor a."""
        check_inputs(embeddings, labels)
        _, neg = pair_masks(labels, mined)
        return self.negative_probabilities(normalized_similarity(embeddings), neg, embeddings.shape[1])

    def negative_probabilities(self, sim: Tensor, neg: Tensor, dim: int) -> Tensor:
        """Row-normalised min(lam, 1/q(max(D, cutoff))) over eligible negatives, in log space."""
        dist = distances_from_similarity(sim)
        eligible = neg & (dist < self.nonzero_loss_cutoff)
        log_w = -log_sphere_distance_density(dist.clamp(min=self.cutoff), dim)
        log_w = log_w.clamp(max=math.log(self.lam)).masked_fill(~eligible, -math.inf)
        probs = torch.softmax(log_w, dim=1)
        return probs.masked_fill(~eligible.any(dim=1, keepdim=True), 0.0)

    def mine(self, sim: Tensor, pos: Tensor, neg: Tensor, dim: int) -> Mined:
        probs = self.negative_probabilities(sim, neg, dim)
        pos_idx, pos_ok = row_table(pos)
        ok = pos_ok & (probs.sum(dim=1, keepdim=True) > 0)
        rows = ok.any(dim=1).nonzero(as_tuple=True)[0]
        if len(rows) == 0:
            empty = empty_triplets(sim.device)
            return empty if self.produces == "triplets" else triplets_as_pairs(empty.triplets, pos)
        # one draw per positive of each anchor: a row of draws per anchor, as wide as its positives
        draws = torch.zeros_like(pos_idx)
        draws[rows] = torch.multinomial(
            probs[rows], pos_idx.shape[1], replacement=True, generator=self.generator(sim.device)
        )
        anchor = torch.arange(sim.shape[0], device=sim.device)[:, None].expand_as(pos_idx)
        triplets = (anchor[ok], pos_idx[ok], draws[ok])
        return Mined(triplets=triplets) if self.produces == "triplets" else triplets_as_pairs(triplets, pos)
