"""The miner contract and its helpers: every miner is called as `miner(embeddings, labels, mined=None) -> Mined`,
L2-normalises the embeddings itself, only considers the pairs of `mined` when given, and says in `produces`
whether it returns pair masks ("pairs") or (anchor, positive, negative) triplets ("triplets")."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from metricsearch.train.losses.base import Mined, check_inputs, pair_masks


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
