"""The loss contract: every metric loss is a function of the B x B similarity matrix.

Following the multi-similarity paper's General Pair Weighting (GPW) view, a pair-based loss is
computed from `S = similarity(embeddings)` (or from the only block of S it reads, `block`);
`pair_weights` returns |dL/dS_ij| by autograd through the very same code path as `forward`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metricsearch.train.deprecated_aliases import renamed_attribute

if TYPE_CHECKING:  # a type only: the weightings' package imports the losses (its DRO weightings use their helpers)
    from metricsearch.train.weightings.base import Weighting


@dataclass
class Mined:
    """Pairs or triplets selected by a miner or batch design, in batch indices.

    `pos` / `neg` are B x B boolean masks of the positive / negative pairs to use (a pair loss
    uses all label-consistent pairs where a mask is None). `triplets` holds (anchor, positive,
    negative) index tensors for triplet losses.
    """

    pos: Tensor | None = None
    neg: Tensor | None = None
    triplets: tuple[Tensor, Tensor, Tensor] | None = None


def check_inputs(embeddings: Tensor, labels: Tensor) -> None:
    """Raise a ValueError naming the parameter when embeddings or labels are malformed."""
    if not isinstance(embeddings, Tensor) or embeddings.dim() != 2:
        shape = tuple(embeddings.shape) if isinstance(embeddings, Tensor) else type(embeddings)
        raise ValueError(f"embeddings must be a 2-D tensor (batch x dim), got {shape}")
    if not isinstance(labels, Tensor) or labels.dim() != 1:
        shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels)
        raise ValueError(f"labels must be a 1-D tensor, got {shape}")
    if labels.shape[0] != embeddings.shape[0]:
        raise ValueError(
            f"labels has {labels.shape[0]} entries but embeddings has {embeddings.shape[0]} rows"
        )


def label_masks(labels: Tensor) -> tuple[Tensor, Tensor]:
    """B x B masks of positive pairs (same label, i != j) and negative pairs (different label)."""
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(labels.shape[0], dtype=torch.bool, device=labels.device)
    return same & ~eye, ~same


def reference_masks(labels: Tensor, ref_labels: Tensor) -> tuple[Tensor, Tensor]:
    """B x (B + M) masks of positive and negative pairs between the batch and [the batch; M references],
    each row's pair with itself left out."""
    same = labels[:, None] == torch.cat([labels, ref_labels])[None, :]
    itself = torch.zeros_like(same)
    itself[:, : labels.shape[0]] = torch.eye(labels.shape[0], dtype=torch.bool, device=labels.device)
    return same & ~itself, ~same


def pair_masks(labels: Tensor, mined: Mined | None) -> tuple[Tensor, Tensor]:
    """Positive and negative masks restricted to the mined pairs, if any."""
    pos, neg = label_masks(labels)
    if mined is not None and mined.pos is not None:
        pos = pos & mined.pos
    if mined is not None and mined.neg is not None:
        neg = neg & mined.neg
    return pos, neg


def check_positive(**params: float) -> None:
    """Raise a ValueError naming the first parameter that is not a positive finite number."""
    for name, value in params.items():
        if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
            raise ValueError(f"{name} must be a positive number, got {value!r}")


def zero_loss(embeddings: Tensor) -> Tensor:
    """A zero scalar that keeps the autograd graph (for batches with nothing to learn from)."""
    return embeddings.sum() * 0.0


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of `values` where `mask` holds; 0 (with graph) when the mask is empty."""
    count = mask.sum()
    total = torch.where(mask, values, torch.zeros_like(values)).sum()
    return total / count.clamp(min=1)


def masked_logsumexp(values: Tensor, mask: Tensor, dim: int = -1) -> Tensor:
    """log sum exp over `dim` restricted to `mask`; -inf-safe: rows with no entry give -inf."""
    neg_inf = torch.finfo(values.dtype).min
    return torch.logsumexp(values.masked_fill(~mask, neg_inf), dim=dim).masked_fill(
        ~mask.any(dim=dim), float("-inf")
    )


def distances_from_similarity(sim: Tensor, eps: float = 1e-12) -> Tensor:
    """Euclidean distances of unit vectors from their cosine similarities, sqrt safely clamped."""
    return torch.sqrt((2.0 - 2.0 * sim).clamp(min=eps))


class MetricLoss(nn.Module):
    """Base of every loss: called as `loss(embeddings, labels, mined=None, weighting=None, indices=None)`.

    `indices` are the batch's data set indices, for losses with per-image state (margin's beta_img).
    """

    #: what mined input the loss consumes: "pairs" (masks), "triplets", or "none" (ignores it)
    mines: ClassVar[str] = "pairs"
    #: whether a weighting (importance weights, DRO) can replace the loss's own mean over pairs
    accepts_weighting: ClassVar[bool] = False
    #: whether embeddings are L2-normalised before the similarity is taken
    normalize: bool = True

    def similarity(self, embeddings: Tensor, other: Tensor | None = None) -> Tensor:
        """Similarities of the rows of `embeddings` to those of `other` (default: all of S, B x B).

        Cosine on normalised embeddings, else the dot product; computed in float32 (float64 inputs
        stay float64), with autocast off so that half-precision training does not round the
        similarities the losses exponentiate.
        """
        with torch.autocast(embeddings.device.type, enabled=False):
            rows = self._prepare(embeddings)
            return rows @ (rows if other is None else self._prepare(other)).t()

    def _prepare(self, embeddings: Tensor) -> Tensor:
        emb = embeddings if embeddings.dtype == torch.float64 else embeddings.float()
        return F.normalize(emb, dim=1) if self.normalize else emb

    def check_weighting(self, weighting: Weighting | None) -> None:
        """Raise a ValueError when a weighting is given to a loss that cannot take one."""
        if weighting is not None and not self.accepts_weighting:
            raise ValueError(
                f"loss {type(self).__name__} does not take a pair weighting; "
                "use a pair loss such as contrastive, or drop the weighting"
            )

    def block(self, labels: Tensor) -> tuple[Tensor, Tensor] | None:
        """Rows and columns (batch indices) of the only block of S the loss reads; None: all of S."""
        return None

    def used_similarity(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """The part of S that `batch_loss` reads: all of S, or the block `block` names."""
        block = self.block(labels)
        if block is None:
            return self.similarity(embeddings)
        rows, cols = block
        return self.similarity(embeddings[rows], embeddings[cols])

    def forward(
        self,
        embeddings: Tensor,
        labels: Tensor,
        mined: Mined | None = None,
        weighting: Weighting | None = None,
        indices: Tensor | None = None,
    ) -> Tensor:
        """The batch loss, a scalar tensor."""
        check_inputs(embeddings, labels)
        self.check_weighting(weighting)
        sim = self.used_similarity(embeddings, labels)
        out = self.batch_loss(sim, labels, mined, weighting, indices)
        extra = self.extra_loss(embeddings)
        if extra is not None:
            out = out + extra
        return out + zero_loss(embeddings)  # keeps the graph even where the loss is constant

    def batch_loss(
        self, sim: Tensor, labels: Tensor, mined: Mined | None = None, weighting: Weighting | None = None,
        indices: Tensor | None = None,
    ) -> Tensor:
        """The batch loss from `used_similarity` (S, or its block); a pair loss also takes a weighting and indices."""
        return self.loss_from_similarity(sim, labels, mined)

    def loss_from_similarity(self, sim: Tensor, labels: Tensor, mined: Mined | None = None) -> Tensor:
        """The loss from S (or its block) and the mined pairs; every loss but the pair losses implements this."""
        raise NotImplementedError

    def loss_against(self, embeddings: Tensor, labels: Tensor, refs: Tensor, ref_labels: Tensor) -> Tensor:
        """The loss of the batch's anchors against the batch and extra references (a cross-batch memory);
        only losses whose terms are per-anchor sums over references implement it."""
        raise NotImplementedError(f"{type(self).__name__} does not take references beyond the batch")

    def extra_loss(self, embeddings: Tensor) -> Tensor | None:
        """Terms that do not go through S (e.g. an L2 penalty); None when there are none."""
        return None

    def pair_weights(
        self, embeddings: Tensor, labels: Tensor, mined: Mined | None = None, indices: Tensor | None = None
    ) -> Tensor:
        """B x B General Pair Weighting |dL/dS_ij|, by autograd through `batch_loss`."""
        check_inputs(embeddings, labels)
        with torch.enable_grad():
            sim = self.used_similarity(embeddings.detach(), labels).requires_grad_(True)
            loss = self.batch_loss(sim, labels, mined, None, indices)
            (grad,) = torch.autograd.grad(loss, sim, allow_unused=True)
        weights = torch.zeros_like(sim) if grad is None else grad.abs()
        block = self.block(labels)
        if block is None:
            return weights
        full = weights.new_zeros(labels.shape[0], labels.shape[0])
        full[block[0][:, None], block[1][None, :]] = weights
        return full

    def weighted_pairs(self, embeddings: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The pairs the loss weighs, for plots: their similarities, `pair_weights`, and the masks of the positive
        and the negative ones (here the batch's B x B pairs)."""
        with torch.no_grad():
            sim = self.similarity(embeddings.detach())
        return (sim, self.pair_weights(embeddings, labels), *label_masks(labels))


class PairLoss(MetricLoss):
    """A loss that weighs per-pair losses l_ij; any weighting can replace its own (the mean)."""

    accepts_weighting: ClassVar[bool] = True

    def pair_losses(
        self, sim: Tensor, labels: Tensor, pos: Tensor, neg: Tensor, indices: Tensor | None = None
    ) -> Tensor:
        """B x B per-pair losses (only entries under pos | neg are used)."""
        raise NotImplementedError

    def weigh(
        self, losses: Tensor, pos: Tensor, neg: Tensor, labels: Tensor, indices: Tensor | None = None
    ) -> Tensor:
        """The loss's own weighting: the mean over the pairs that count."""
        return masked_mean(losses, pos | neg)

    def batch_loss(
        self, sim: Tensor, labels: Tensor, mined: Mined | None = None, weighting: Weighting | None = None,
        indices: Tensor | None = None,
    ) -> Tensor:
        pos, neg = pair_masks(labels, mined)
        losses = self.pair_losses(sim, labels, pos, neg, indices)
        if weighting is not None:
            return weighting(losses, pos, neg, labels)
        return self.weigh(losses, pos, neg, labels, indices)


def __getattr__(name: str) -> Any:
    """Deprecated names: `Weighting` moved to metricsearch.train.weightings (goes in the next release)."""
    return renamed_attribute(__name__, name, {"Weighting": "metricsearch.train.weightings.Weighting"})
