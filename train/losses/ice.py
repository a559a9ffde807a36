"""Instance Cross Entropy (Wang et al. 2019): per-anchor matching probabilities of each positive
against all negatives, with the paper's per-anchor gradient re-weighting (eqs. 13-15)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from metricsearch.train.losses.registry import register
from metricsearch.train.losses.base import (
    MetricLoss,
    Mined,
    check_positive,
    masked_logsumexp,
    pair_masks,
)


def masked_softmax(values: Tensor, mask: Tensor) -> Tensor:
    """Row-wise softmax over the entries under `mask`, 0 elsewhere (for detached weights only)."""
    lse = masked_logsumexp(values, mask, dim=1)[:, None]
    return torch.where(mask, torch.exp(values - lse), torch.zeros_like(values))


def ice_weights(sim: Tensor, pos: Tensor, neg: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """The re-weighted |dL/dS| of ICE eqs. 13 (positives) and 14 (negatives), B x B each.

    With p(i|a) = e^{s S_ai} / (e^{s S_ai} + sum_{N_a} e^{s S_aj}): eq. 13 is
    1/(2N) (1 - p(i|a)) / sum_i (1 - p(i|a)), a softmax over P_a of log(1 - p(i|a)) =
    -softplus(s S_ai - lse_{N_a}(s S)); eq. 14's sum_i p(j|a,i) / sum_i (1 - p(i|a)) reduces to
    e^{s S_aj} / sum_{N_a} e^{s S_ak}, a softmax over N_a. Anchors lacking positives or negatives
    get zero weights (their loss is 0).
    """
    n = sim.shape[0]
    valid = (pos.any(dim=1) & neg.any(dim=1))[:, None]
    scaled = scale * sim
    lse_neg = masked_logsumexp(scaled, neg, dim=1)[:, None]
    log_one_minus_p = -F.softplus(scaled - lse_neg)
    w_pos = masked_softmax(log_one_minus_p, pos & valid) / (2 * n)
    w_neg = masked_softmax(scaled, neg & valid) / (2 * n)
    return w_pos, w_neg


@register("ice")
class InstanceCrossEntropyLoss(MetricLoss):
    """Instance Cross Entropy: -1/N sum_a sum_{i in P_a} log p(i|a), with re-weighted gradients.

    The value is eq. 5 with the paper's 1/N over anchors (N = batch size), so -log p(i|a) =
    softplus(lse_{N_a}(s S) - s S_ai). With `reweight` (the paper's training rule, eq. 15) the
    gradient w.r.t. S is replaced by eqs. 13-14: per anchor with positives and negatives, the
    positives carry 1/(2N) and the negatives 1/(2N) of the weight, positives pulled (dL/dS < 0),
    negatives pushed. This is done with a detached surrogate (value + g - g.detach(), g linear in
    S), so `pair_weights` returns exactly those weights; the re-weighted gradient is not the
    derivative of the value. `reweight=False` gives the plain gradient of the value.
    """

    def __init__(self, scale: float = 64.0, reweight: bool = True) -> None:
        super().__init__()
        check_positive(scale=scale)
        self.scale, self.reweight = scale, reweight

    def loss_from_similarity(self, sim: Tensor, labels: Tensor, mined: Mined | None = None) -> Tensor:
        pos, neg = pair_masks(labels, mined)
        n = sim.shape[0]
        lse_neg = masked_logsumexp(self.scale * sim, neg, dim=1)[:, None]
        nll = F.softplus(lse_neg - self.scale * sim)  # 0 where the anchor has no negative
        value = torch.where(pos, nll, torch.zeros_like(nll)).sum() / n
        if not self.reweight:
            return value
        w_pos, w_neg = ice_weights(sim.detach(), pos, neg, self.scale)
        surrogate = ((w_neg - w_pos) * sim).sum()
        return value.detach() + (surrogate - surrogate.detach())
