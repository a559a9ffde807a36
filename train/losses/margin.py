"""Margin-based loss (Wu et al. 2017, "Sampling matters"): `[a + y_ij (D_ij - beta(i))]_+`."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metricsearch.train.losses.registry import register
from metricsearch.train.losses.base import PairLoss, distances_from_similarity

BETA_MODES = ("fixed", "learned", "class", "image")


@register("margin")
class MarginLoss(PairLoss):
    """Margin loss with boundary beta(i) = beta0 [+ beta_class[c(i)] [+ beta_img[i]]], normalised by non-zero pairs.

    beta_mode "fixed": beta0 is a constant; "learned": beta0 is learned; "class": beta0 is a
    constant and a per-class offset beta_class (starting at 0, labels in [0, num_classes)) is
    learned; "image": the paper's full form, a per-class and a per-image offset beta_img
    (starting at 0, one per training image: `num_images`) are learned, the batch's data set
    indices selecting the per-image terms (`forward(..., indices=...)`, passed by the trainer, and
    `pair_weights(..., indices=...)`). With learned betas the regulariser nu * sum over the pairs
    of beta(i) (the paper's objective, one term per pair) is added before dividing by the number of
    pairs with non-zero loss. `beta_lr` is the betas' own learning rate (the paper gives none;
    0.0005 as in Roth et al.'s "Revisiting" benchmark; None: the base learning rate), see
    `param_groups`.
    """

    def __init__(
        self,
        margin: float = 0.2,
        beta0: float = 1.2,
        beta_mode: str = "fixed",
        num_classes: int | None = None,
        num_images: int | None = None,
        nu: float = 0.0,
        beta_lr: float | None = 0.0005,
    ) -> None:
        super().__init__()
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        if beta_mode not in BETA_MODES:
            raise ValueError(f"beta_mode must be one of {BETA_MODES}, got {beta_mode!r}")
        if nu < 0:
            raise ValueError(f"nu must be >= 0, got {nu}")
        if beta_lr is not None and beta_lr < 0:
            raise ValueError(f"beta_lr must be >= 0, got {beta_lr}")
        if beta_mode in ("class", "image") and (num_classes is None or num_classes < 1):
            raise ValueError(
                f"num_classes (>= 1) is required for beta_mode={beta_mode!r}, got {num_classes}"
            )
        if beta_mode == "image" and (num_images is None or num_images < 1):
            raise ValueError(f"num_images (>= 1) is required for beta_mode='image', got {num_images}")
        self.margin, self.beta_mode, self.nu, self.beta_lr = margin, beta_mode, nu, beta_lr
        if beta_mode == "learned":
            self.beta0 = nn.Parameter(torch.tensor(float(beta0)))
        else:
            self.register_buffer("beta0", torch.tensor(float(beta0)))
        self.beta_class = (
            nn.Parameter(torch.zeros(num_classes)) if beta_mode in ("class", "image") else None
        )
        self.beta_image = nn.Parameter(torch.zeros(num_images)) if beta_mode == "image" else None

    def betas(self, labels: Tensor, indices: Tensor | None = None) -> Tensor:
        """beta(i) for every anchor of the batch (a length-B vector); `indices` select the per-image terms."""
        beta = self.beta0.expand(labels.shape[0])
        if self.beta_class is not None:
            if labels.min() < 0 or labels.max() >= self.beta_class.shape[0]:
                raise ValueError(
                    f"labels must lie in [0, num_classes={self.beta_class.shape[0]}) "
                    "for beta_mode='class'"
                )
            beta = beta + self.beta_class[labels]
        if self.beta_image is not None:
            if indices is None:
                raise ValueError("beta_mode='image' needs indices: the data set index of every embedding")
            if indices.shape != labels.shape or indices.min() < 0 or indices.max() >= len(self.beta_image):
                raise ValueError(
                    f"indices must be one per embedding, in [0, num_images={len(self.beta_image)})"
                )
            beta = beta + self.beta_image[indices]
        return beta

    def pair_losses(
        self, sim: Tensor, labels: Tensor, pos: Tensor, neg: Tensor, indices: Tensor | None = None
    ) -> Tensor:
        y = pos.to(sim.dtype) * 2.0 - 1.0
        beta = self.betas(labels, indices).to(sim.dtype)[:, None]
        return F.relu(self.margin + y * (distances_from_similarity(sim) - beta))

    def weigh(
        self, losses: Tensor, pos: Tensor, neg: Tensor, labels: Tensor, indices: Tensor | None = None
    ) -> Tensor:
        """Sum of the pair losses (plus the beta regulariser) over the number of non-zero ones."""
        used = pos | neg
        total = torch.where(used, losses, torch.zeros_like(losses)).sum()
        if self.beta_mode != "fixed" and self.nu > 0:
            beta = self.betas(labels, indices).to(losses.dtype)
            total = total + self.nu * (used.sum(dim=1).to(losses.dtype) * beta).sum()
        return total / ((losses > 0) & used).sum().clamp(min=1)

    def param_groups(self, base_lr: float) -> list[dict[str, Any]]:
        """Optimiser groups for the loss's own parameters (the learned betas, at `beta_lr`)."""
        params = [p for p in self.parameters() if p.requires_grad]
        lr = base_lr if self.beta_lr is None else self.beta_lr
        return [{"params": params, "lr": lr}] if params else []
