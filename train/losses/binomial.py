"""Binomial deviance loss (MS paper eq. 9), its MS-mined variant Binomial_m, and BinLifted, the
average of binomial deviance and LiftedStruct* (MS paper section 3 and Table 2)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from metricsearch.train.losses.registry import register
from metricsearch.train.losses.base import MetricLoss, Mined, check_positive
from metricsearch.train.losses.lifted import lifted_star_terms
from metricsearch.train.losses.ms import check_epsilon, ms_pairs


def binomial_terms(
    sim: Tensor, pos: Tensor, neg: Tensor, alpha: float, beta: float, base: float
) -> Tensor:
    """Per-anchor binomial deviance (eq. 9 before the sum over anchors): the mean over P_i of
    softplus(a(l - S)) plus the mean over N_i of softplus(b(S - l)); an empty set adds 0."""
    zero = torch.zeros_like(sim)
    pos_loss = torch.where(pos, F.softplus(alpha * (base - sim)), zero).sum(dim=1)
    neg_loss = torch.where(neg, F.softplus(beta * (sim - base)), zero).sum(dim=1)
    return pos_loss / pos.sum(dim=1).clamp(min=1) + neg_loss / neg.sum(dim=1).clamp(min=1)


@register("binomial")
class BinomialDevianceLoss(MetricLoss):
    """Binomial deviance (MS paper eq. 9), optionally on MS-mined pairs (the paper's Binomial_m).

    Eq. 9 sums over the m anchors; we divide by m (mean over anchors) like MS (eq. 15) and
    LiftedStruct* (eq. 16), so the three compare on one scale; this only rescales by m.
    """

    def __init__(
        self, alpha: float = 2.0, beta: float = 50.0, base: float = 0.5, mining: bool = False,
        epsilon: float = 0.1,
    ) -> None:
        super().__init__()
        check_positive(alpha=alpha, beta=beta)
        check_epsilon(epsilon)
        self.alpha, self.beta, self.base = alpha, beta, base
        self.mining, self.epsilon = mining, epsilon

    def loss_from_similarity(self, sim: Tensor, labels: Tensor, mined: Mined | None = None) -> Tensor:
        pos, neg = ms_pairs(sim, labels, mined, self.mining, self.epsilon)
        return binomial_terms(sim, pos, neg, self.alpha, self.beta, self.base).mean()


@register("binomial_ms")
def binomial_ms(
    alpha: float = 2.0, beta: float = 50.0, base: float = 0.5, epsilon: float = 0.1
) -> BinomialDevianceLoss:
    """Binomial_m (MS paper Table 2): binomial deviance on the MS-mined pairs."""
    return BinomialDevianceLoss(alpha=alpha, beta=beta, base=base, mining=True, epsilon=epsilon)


@register("binlifted")
class BinLiftedLoss(BinomialDevianceLoss):
    """BinLifted (MS paper): 0.5 * (binomial deviance + LiftedStruct*), averaging their pair weights.

    We follow the paper's definition in section 3 ("an average weighting scheme of binomial
    deviance (Eq. 10) and lifted structure", compared against MS weighting) and Table 2, which lists
    BinLifted as weighting by Similarity-S and -N only (no P, i.e. no MS mining): `mining=False` by
    default. The ablation discussion calls it a combination of Binomial and LiftedStruct*_m;
    `mining=True` gives that reading (both terms on the MS-mined pairs). The supplementary material
    is not available to us.
    """

    def loss_from_similarity(self, sim: Tensor, labels: Tensor, mined: Mined | None = None) -> Tensor:
        pos, neg = ms_pairs(sim, labels, mined, self.mining, self.epsilon)
        binomial = binomial_terms(sim, pos, neg, self.alpha, self.beta, self.base)
        lifted = lifted_star_terms(sim, pos, neg, self.alpha, self.beta)
        return 0.5 * (binomial + lifted).mean()
