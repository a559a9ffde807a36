"""Log-sum-exp family losses (MS, lifted, binomial, ICE) against loop references from the papers."""

from __future__ import annotations

import math
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from metricsearch.train.losses import MetricLoss, build
from metricsearch.train.losses.ms import ms_mine
from metricsearch.train.losses.base import label_masks

STRUCTURES = {
    "balanced": [0, 0, 1, 1, 2, 2, 3, 3, 4, 4],
    "unbalanced": [0, 0, 0, 0, 0, 1, 1, 2, 2, 2],
    "singleton": [0, 0, 0, 1, 2, 2, 3, 3, 3, 4],
}
EPS = 0.1


# ---------------------------------------------------------------- loop references (float64)


def sets(labels: list[int], i: int) -> tuple[list[int], list[int]]:
    """Positives and negatives of anchor i."""
    pos = [k for k in range(len(labels)) if k != i and labels[k] == labels[i]]
    neg = [k for k in range(len(labels)) if labels[k] != labels[i]]
    return pos, neg


def mined_sets(s: Tensor, labels: list[int], i: int, mining: bool) -> tuple[list[int], list[int]]:
    """Positives and negatives of anchor i kept by MS mining (eqs. 11-12, typo fixed)."""
    pos, neg = sets(labels, i)
    if not mining:
        return pos, neg
    s = s.detach()
    min_pos = min((float(s[i, k]) for k in pos), default=math.inf)
    max_neg = max((float(s[i, k]) for k in neg), default=-math.inf)
    return [k for k in pos if float(s[i, k]) < max_neg + EPS], [
        k for k in neg if float(s[i, k]) > min_pos - EPS
    ]


def lse(terms: list[Tensor]) -> Tensor:
    """log sum exp of a non-empty list of scalars, written out."""
    return torch.log(sum(torch.exp(t) for t in terms))


def ref_ms(s: Tensor, y: list[int], mining: bool = True, a=2.0, b=50.0, base=0.5) -> Tensor:
    """MS eq. 15 (MS weighting when not mining)."""
    total = s.new_zeros(())
    for i in range(len(y)):
        pos, neg = mined_sets(s, y, i, mining)
        total = total + torch.log(1 + sum((torch.exp(-a * (s[i, k] - base)) for k in pos), s.new_zeros(()))) / a
        total = total + torch.log(1 + sum((torch.exp(b * (s[i, k] - base)) for k in neg), s.new_zeros(()))) / b
    return total / len(y)


def ref_ms_mining(s: Tensor, y: list[int]) -> Tensor:
    """MS mining with equal weights, as documented in MSMiningLoss."""
    total = s.new_zeros(())
    for i in range(len(y)):
        pos, neg = mined_sets(s, y, i, True)
        total = total + sum((1 + s[i, k] for k in neg), s.new_zeros(()))
        total = total + sum((1 - s[i, k] for k in pos), s.new_zeros(()))
    return total / len(y)


def ref_lifted(s: Tensor, y: list[int], a: float = 1.0) -> Tensor:
    """Song et al. 2016 over unordered positive pairs."""
    def d(i: int, j: int) -> Tensor:
        return torch.sqrt(2 - 2 * s[i, j])

    total, count = s.new_zeros(()), 0
    for i in range(len(y)):
        for j in range(i + 1, len(y)):
            if y[i] != y[j]:
                continue
            count += 1
            terms = [a - d(i, k) for k in sets(y, i)[1]] + [a - d(j, k) for k in sets(y, j)[1]]
            if terms:
                total = total + torch.relu(lse(terms) + d(i, j)) ** 2
    return total / (2 * count) if count else total


def ref_generalized_lifted(s: Tensor, y: list[int], margin: float = 1.0) -> Tensor:
    """MS paper eq. 6, divided by m."""
    total = s.new_zeros(())
    for i in range(len(y)):
        pos, neg = sets(y, i)
        if pos and neg:
            total = total + torch.relu(lse([margin - s[i, k] for k in pos]) + lse([s[i, k] for k in neg]))
    return total / len(y)


def ref_lifted_star(s: Tensor, y: list[int], mining: bool = False, a=2.0, b=50.0) -> Tensor:
    """MS paper eq. 16 (LiftedStruct*_m when mining)."""
    total = s.new_zeros(())
    for i in range(len(y)):
        pos, neg = mined_sets(s, y, i, mining)
        if pos and neg:
            total = total + lse([-a * s[i, k] for k in pos]) / a + lse([b * s[i, k] for k in neg]) / b
    return total / len(y)


def ref_binomial(s: Tensor, y: list[int], mining: bool = False, a=2.0, b=50.0, base=0.5) -> Tensor:
    """MS paper eq. 9, divided by m (Binomial_m when mining)."""
    total = s.new_zeros(())
    for i in range(len(y)):
        pos, neg = mined_sets(s, y, i, mining)
        if pos:
            total = total + sum(torch.log(1 + torch.exp(a * (base - s[i, k]))) for k in pos) / len(pos)
        if neg:
            total = total + sum(torch.log(1 + torch.exp(b * (s[i, k] - base))) for k in neg) / len(neg)
    return total / len(y)


def ref_binlifted(s: Tensor, y: list[int], mining: bool = False) -> Tensor:
    """Average of binomial deviance and LiftedStruct*."""
    return 0.5 * (ref_binomial(s, y, mining) + ref_lifted_star(s, y, mining))


def ref_ice(s: Tensor, y: list[int], scale: float = 64.0) -> Tensor:
    """ICE eq. 5 with the 1/N over anchors."""
    total = s.new_zeros(())
    for a in range(len(y)):
        pos, neg = sets(y, a)
        for i in pos:
            p = torch.exp(scale * s[a, i]) / (
                torch.exp(scale * s[a, i]) + sum((torch.exp(scale * s[a, j]) for j in neg), s.new_zeros(()))
            )
            total = total - torch.log(p)
    return total / len(y)


def ref_ice_weights(s: Tensor, y: list[int], scale: float = 64.0) -> Tensor:
    """ICE eqs. 13 (positives) and 14 (negatives), anchor a in row a."""
    n = len(y)
    w = torch.zeros(n, n, dtype=torch.float64)
    e = torch.exp(scale * s.detach())
    for a in range(n):
        pos, neg = sets(y, a)
        if not (pos and neg):
            continue
        denom = {i: e[a, i] + sum(e[a, j] for j in neg) for i in pos}
        one_minus_p = {i: 1 - e[a, i] / denom[i] for i in pos}
        total = sum(one_minus_p.values())
        for i in pos:
            w[a, i] = one_minus_p[i] / total / (2 * n)
        for j in neg:
            w[a, j] = sum(e[a, j] / denom[i] for i in pos) / total / (2 * n)
    return w


# name -> (build params, reference)
CASES: dict[str, tuple[dict, Callable[[Tensor, list[int]], Tensor]]] = {
    "ms": ({}, ref_ms),
    "ms_weighting": ({}, lambda s, y: ref_ms(s, y, mining=False)),
    "ms_mining": ({}, ref_ms_mining),
    "lifted": ({}, ref_lifted),
    "generalized_lifted": ({}, ref_generalized_lifted),
    "lifted_star": ({}, ref_lifted_star),
    "lifted_star_ms": ({}, lambda s, y: ref_lifted_star(s, y, mining=True)),
    "binomial": ({}, ref_binomial),
    "binomial_ms": ({}, lambda s, y: ref_binomial(s, y, mining=True)),
    "binlifted": ({}, ref_binlifted),
    "binlifted_mined": ({"mining": True}, lambda s, y: ref_binlifted(s, y, mining=True)),
    "ice": ({"reweight": False}, ref_ice),
}


def build_case(case: str) -> MetricLoss:
    """The loss module a CASES entry tests."""
    params, _ = CASES[case]
    return build("binlifted" if case == "binlifted_mined" else case, **params)


def cosine(emb: Tensor) -> Tensor:
    """Cosine similarity matrix, written out."""
    f = F.normalize(emb, dim=1)
    return f @ f.t()


def batch(structure: str, seed: int, dim: int = 4) -> tuple[Tensor, Tensor, list[int]]:
    """Float64 embeddings, label tensor and label list of a class structure."""
    y = STRUCTURES[structure]
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(len(y), dim, generator=g, dtype=torch.float64)
    return emb, torch.tensor(y), y


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("structure", list(STRUCTURES))
@pytest.mark.parametrize("case", list(CASES))
def test_value_and_gradient_match_loop_reference(case: str, structure: str) -> None:
    for seed in range(2):
        emb, labels, y = batch(structure, seed)
        ours_in = emb.clone().requires_grad_(True)
        ours = build_case(case)(ours_in, labels)
        ours.backward()
        ref_in = emb.clone().requires_grad_(True)
        ref = CASES[case][1](cosine(ref_in), y)
        assert ours.dtype == torch.float64
        torch.testing.assert_close(ours, ref.detach(), rtol=1e-6, atol=1e-12)
        if ref.requires_grad:
            ref.backward()
            torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=1e-6, atol=1e-10)
        else:
            assert torch.count_nonzero(ours_in.grad) == 0


@pytest.mark.parametrize("case", list(CASES))
def test_gradcheck(case: str) -> None:
    loss = build_case(case)
    emb, labels, _ = batch("unbalanced", 3)
    emb.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: loss(e, labels), (emb,), eps=1e-6, atol=1e-5)


def test_ice_value_is_eq5_over_n_also_when_reweighted() -> None:
    emb, labels, y = batch("singleton", 1)
    torch.testing.assert_close(build("ice")(emb, labels), ref_ice(cosine(emb), y), rtol=1e-6, atol=0)


@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_ice_reweighted_gradient_is_eqs_13_14(structure: str) -> None:
    emb, labels, y = batch(structure, 5, dim=3)
    loss = build("ice")
    weights = loss.pair_weights(emb, labels)
    expected = ref_ice_weights(cosine(emb), y)
    torch.testing.assert_close(weights, expected, rtol=1e-6, atol=1e-15)
    n = len(y)
    pos, neg = label_masks(labels)
    has_both = pos.any(1) & neg.any(1)
    for mask in (pos, neg):
        sums = torch.where(mask, weights, 0).sum(1)
        torch.testing.assert_close(sums[has_both], torch.full_like(sums[has_both], 1 / (2 * n)))
        assert torch.all(sums[~has_both] == 0)
    # signs: positives pulled together, negatives pushed apart; the gradient w.r.t. the embeddings
    # is the re-weighted one, not the gradient of the value
    sim = cosine(emb).requires_grad_(True)
    (grad,) = torch.autograd.grad(loss.loss_from_similarity(sim, labels), sim)
    assert torch.all(grad[pos] <= 0) and torch.all(grad[neg] >= 0)
    assert torch.all(grad[~(pos | neg)] == 0)


def test_ice_weights_stable_in_float32_with_scale_64() -> None:
    emb = torch.randn(64, 16)
    labels = torch.arange(8).repeat_interleave(8)
    weights = build("ice").pair_weights(emb, labels)
    assert torch.isfinite(weights).all()
    torch.testing.assert_close(weights.sum(1), torch.full((64,), 1 / 64), rtol=1e-5, atol=0)


@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_ms_keeps_exactly_the_mined_pairs(structure: str) -> None:
    emb, labels, _ = batch(structure, 7, dim=3)
    pos, neg = label_masks(labels)
    kept_pos, kept_neg = ms_mine(cosine(emb), pos, neg, EPS)
    kept = kept_pos | kept_neg
    assert kept_pos.any() and kept_neg.any() and (~kept & (pos | neg)).any()
    weights = build("ms").pair_weights(emb, labels)
    assert torch.all(weights[~kept] == 0)
    assert torch.all(weights[kept] > 0)
    equal = build("ms_mining").pair_weights(emb, labels)
    torch.testing.assert_close(equal, kept.double() / len(labels), rtol=0, atol=1e-15)
    unmined = build("ms_weighting").pair_weights(emb, labels)
    assert torch.all(unmined[pos | neg] > 0)


# ---------------------------------------------------------------- pytorch-metric-learning


def pml_batch() -> tuple[Tensor, Tensor]:
    """Float64 batch where every anchor has positives and negatives (4 classes x 4 images)."""
    g = torch.Generator().manual_seed(11)
    return torch.randn(16, 8, generator=g, dtype=torch.float64), torch.arange(4).repeat_interleave(4)


def test_ms_matches_pml_loss_with_miner() -> None:
    pytest.importorskip("pytorch_metric_learning")
    from pytorch_metric_learning import losses, miners

    emb, labels = pml_batch()
    for eps in (0.1, 0.3):
        miner = miners.MultiSimilarityMiner(epsilon=eps)
        theirs = losses.MultiSimilarityLoss(alpha=2, beta=50, base=0.5)(emb, labels, miner(emb, labels))
        # PML averages the per-anchor terms over all B anchors (MeanReducer): our 1/m, factor 1
        ours = build("ms", epsilon=eps)(emb, labels)
        torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-5, atol=0)


def test_generalized_lifted_matches_pml() -> None:
    pytest.importorskip("pytorch_metric_learning")
    from pytorch_metric_learning import losses
    from pytorch_metric_learning.distances import CosineSimilarity

    emb, labels = pml_batch()
    for margin in (1.0, 0.5):
        # with a similarity, PML's margins read: relu(lse_P(pos_margin - S) + lse_N(S - neg_margin))
        theirs = losses.GeneralizedLiftedStructureLoss(
            neg_margin=0.0, pos_margin=margin, distance=CosineSimilarity()
        )(emb, labels)
        ours = build("generalized_lifted", margin=margin)(emb, labels)
        torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-5, atol=0)


def test_lifted_matches_pml() -> None:
    pytest.importorskip("pytorch_metric_learning")
    from pytorch_metric_learning import losses

    emb, labels = pml_batch()
    theirs = losses.LiftedStructureLoss(neg_margin=1.0, pos_margin=0.0)(emb, labels)
    ours = build("lifted")(emb, labels)
    torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-5, atol=0)


# ---------------------------------------------------------------- robustness

ALL = sorted({n if n != "binlifted_mined" else "binlifted" for n in CASES} | {"ice"})
# losses whose every term needs a positive and a negative for the same anchor
NEEDS_BOTH = {"ms", "ms_mining", "lifted", "generalized_lifted", "lifted_star", "lifted_star_ms",
              "binomial_ms", "ice"}


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("labels", [[0], [1, 1, 1, 1], [0, 1, 2, 3]], ids=["one", "one_class", "all_distinct"])
def test_degenerate_batches_are_finite_with_a_graph(name: str, labels: list[int]) -> None:
    emb = torch.randn(len(labels), 8, requires_grad=True)
    loss = build(name)(emb, torch.tensor(labels))
    assert loss.requires_grad and torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(emb.grad).all()
    if len(labels) == 1 or name in NEEDS_BOTH:
        assert loss.item() == 0.0


@pytest.mark.parametrize("name", ALL)
def test_large_scales_do_not_overflow_float32(name: str) -> None:
    emb = torch.randn(32, 16, requires_grad=True)
    labels = torch.arange(8).repeat_interleave(4)
    loss = build(name)(emb * 100, labels)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(emb.grad).all()


@pytest.mark.parametrize("name", ALL)
def test_bfloat16_autocast_is_finite_and_close_to_float32(name: str) -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 8)
    x = torch.randn(32, 16)
    labels = torch.arange(8).repeat_interleave(4)
    loss = build(name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        emb = layer(x)
        low = loss(emb, labels)
    assert emb.dtype == torch.bfloat16 and low.dtype == torch.float32
    low.backward()
    assert torch.isfinite(low) and all(torch.isfinite(p.grad).all() for p in layer.parameters())
    # the only rounding is the bfloat16 embeddings themselves
    torch.testing.assert_close(low, loss(emb.detach().float(), labels), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(low, loss(layer(x), labels), rtol=0.1, atol=0.02)


@pytest.mark.parametrize(
    "name, param, value",
    [("ms", "alpha", 0.0), ("ms", "beta", -1.0), ("ms", "epsilon", -0.1), ("ms_weighting", "alpha", -2.0),
     ("ms_mining", "epsilon", -1.0), ("lifted", "margin", 0.0), ("generalized_lifted", "margin", math.inf),
     ("lifted_star", "alpha", 0.0), ("lifted_star", "beta", -50.0), ("lifted_star_ms", "epsilon", -0.5),
     ("binomial", "alpha", -1.0), ("binomial", "beta", 0.0), ("binomial_ms", "beta", 0.0),
     ("binlifted", "alpha", 0.0), ("ice", "scale", 0.0), ("ice", "scale", -64.0)],
)
def test_bad_parameters_raise_naming_them(name: str, param: str, value: float) -> None:
    with pytest.raises(ValueError, match=param):
        build(name, **{param: value})
