"""Pair and triplet losses: values and gradients against loop references written from the papers,
gradchecks, limits, pytorch-metric-learning oracles, degenerate batches, bad arguments, autocast."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from metricsearch.train.context import TrainContext
from metricsearch.train.losses import Mined, build
from metricsearch.train.weightings.dro import KLWeighting, TopKPNWeighting, TopKWeighting

LABELS = {
    "balanced": [0, 1, 2, 0, 1, 2, 0, 1, 2],
    "unbalanced": [0, 0, 1, 0, 2, 2, 0, 1, 2, 2],
    "singleton": [3, 0, 0, 1, 1, 1, 2, 0],
}
COUNTS = {0: 7, 1: 4, 2: 9, 3: 1}


def batch(structure: str, dim: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 embeddings (requiring grad) and labels for one class structure."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.tensor(LABELS[structure])
    emb = torch.randn(len(labels), dim, generator=gen, dtype=torch.float64)
    return emb.requires_grad_(True), labels


# ---- loop references, written from the papers' formulas -------------------------------------


def unit(emb: torch.Tensor) -> list[torch.Tensor]:
    return [e / e.norm() for e in emb]


def sim_ref(f: list[torch.Tensor], i: int, j: int) -> torch.Tensor:
    return (f[i] * f[j]).sum()


def dist_ref(f: list[torch.Tensor], i: int, j: int) -> torch.Tensor:
    return (f[i] - f[j]).norm()


def pairs(labels: torch.Tensor):
    """(i, j, same) for all ordered pairs i != j."""
    y = labels.tolist()
    return [(i, j, y[i] == y[j]) for i in range(len(y)) for j in range(len(y)) if i != j]


def contrastive_pair_ref(f, labels, margin=1.0, eta=lambda i, j: 1.0):
    y = labels.tolist()
    out = []
    for i, j, same in pairs(labels):
        d = dist_ref(f, i, j)
        out.append((d**2 if same else eta(y[i], y[j]) * torch.relu(margin - d) ** 2, same))
    return out


def mean_ref(values):
    return sum(v for v, _ in values) / len(values)


def ref_contrastive(emb, labels, margin=1.0):
    return mean_ref(contrastive_pair_ref(unit(emb), labels, margin))


def ref_contrastive_similarity(emb, labels, sim_margin=0.5):
    f = unit(emb)
    return mean_ref(
        [(-sim_ref(f, i, j) if same else torch.relu(sim_ref(f, i, j) - sim_margin), same)
         for i, j, same in pairs(labels)]
    )


def ref_weighted(emb, labels, eta=2.5):
    return mean_ref(contrastive_pair_ref(unit(emb), labels, eta=lambda a, b: eta))


def ref_balanced(emb, labels, lam=256.0, counts=COUNTS):
    big_l = len(counts)
    eta = lambda a, b: lam / (big_l - 1) * (counts[a] - 1) / counts[b]  # noqa: E731  (eq. 16)
    return mean_ref(contrastive_pair_ref(unit(emb), labels, eta=eta))


def ref_triplet(emb, labels, margin=0.2, squared=True):
    f, y, terms = unit(emb), labels.tolist(), []
    for a in range(len(y)):
        for p in range(len(y)):
            for n in range(len(y)):
                if p != a and y[p] == y[a] and y[n] != y[a]:
                    dap, dan = dist_ref(f, a, p), dist_ref(f, a, n)
                    if squared:
                        dap, dan = dap**2, dan**2
                    terms.append(torch.relu(dap - dan + margin))
    return sum(terms) / len(terms)


def ref_margin(emb, labels, margin=0.2, beta=lambda c: 1.2, nu=0.0, image=None):
    f, y = unit(emb), labels.tolist()
    total, nonzero = 0.0, 0
    for i, j, same in pairs(labels):
        sign = 1.0 if same else -1.0
        b = beta(y[i]) + (image[i] if image is not None else 0.0)
        term = torch.relu(margin + sign * (dist_ref(f, i, j) - b))
        total = total + term + nu * b
        nonzero += int(term > 0)
    return total / max(nonzero, 1)


def npair_anchors_ref(labels):
    """(anchor, positive) of each class with two or more images: its first two, in class order."""
    firsts: dict[int, list[int]] = {}
    for i, c in enumerate(labels.tolist()):
        firsts.setdefault(c, []).append(i)
    return [(v[0], v[1]) for c, v in sorted(firsts.items()) if len(v) >= 2]


def ref_npair_from_sim(sim, labels):
    """Mean over anchors of -S_ap + log sum_k exp(S_a,p_k), read from a B x B matrix S."""
    pairs_ = npair_anchors_ref(labels)
    positives = [p for _, p in pairs_]
    terms = [-sim[a, p] + torch.logsumexp(torch.stack([sim[a, k] for k in positives]), 0) for a, p in pairs_]
    return sum(terms) / len(terms)


def ref_npair(emb, labels, l2_reg=0.0):
    reg = l2_reg * sum((e * e).sum() for e in emb) / len(labels)
    return ref_npair_from_sim(emb @ emb.t(), labels) + reg


def dro_pair_ref(emb, labels, margin=0.1, lam=0.5):
    f = unit(emb)
    return [
        (torch.relu(margin + (1.0 if same else -1.0) * (lam - sim_ref(f, i, j))), same)
        for i, j, same in pairs(labels)
    ]


def ref_dro_topk(emb, labels, k=100):
    values = sorted((v for v, _ in dro_pair_ref(emb, labels)), key=lambda v: v.item(), reverse=True)
    values = values[:k]
    return sum(values) / len(values)


def ref_dro_topk_pn(emb, labels, k=10):
    values = dro_pair_ref(emb, labels)
    pos = sorted((v for v, s in values if s), key=lambda v: v.item(), reverse=True)[: k // 2]
    neg = sorted((v for v, s in values if not s), key=lambda v: v.item(), reverse=True)[: k // 2]
    return sum(pos) + sum(neg)


def ref_dro_kl(emb, labels, gamma=0.1):
    values = [v for v, _ in dro_pair_ref(emb, labels)]
    return gamma * torch.log(sum(torch.exp(v / gamma) for v in values) / len(values))


CASES = [
    ("contrastive", {}, ref_contrastive),
    ("contrastive", {"margin": 0.7}, lambda e, y: ref_contrastive(e, y, margin=0.7)),
    ("contrastive", {"form": "similarity"}, ref_contrastive_similarity),
    ("weighted_contrastive", {"eta": 2.5}, ref_weighted),
    ("balanced_contrastive", {"class_counts": COUNTS}, ref_balanced),
    ("triplet", {}, ref_triplet),
    ("triplet_l2", {}, lambda e, y: ref_triplet(e, y, squared=False)),
    ("margin", {}, ref_margin),
    ("margin", {"beta_mode": "learned", "nu": 0.1, "beta0": 1.1},
     lambda e, y: ref_margin(e, y, beta=lambda c: 1.1, nu=0.1)),
    ("npair", {}, lambda e, y: ref_npair(e, y, l2_reg=0.002)),
    ("dro_topk", {}, ref_dro_topk),
    ("dro_topk", {"k": 7}, lambda e, y: ref_dro_topk(e, y, k=7)),
    ("dro_topk_pn", {"k": 10}, ref_dro_topk_pn),
    ("dro_kl", {}, ref_dro_kl),
    ("dro_kl", {"gamma": 1.0}, lambda e, y: ref_dro_kl(e, y, gamma=1.0)),
]


@pytest.mark.parametrize("structure", sorted(LABELS))
@pytest.mark.parametrize(("name", "params", "reference"), CASES)
def test_value_and_gradient_match_loop_reference(name, params, reference, structure):
    emb, labels = batch(structure)
    loss = build(name, **params)(emb, labels)
    assert loss.dtype == torch.float64
    (grad,) = torch.autograd.grad(loss, emb)
    emb_ref = emb.detach().clone().requires_grad_(True)
    expected = reference(emb_ref, labels)
    (grad_ref,) = torch.autograd.grad(expected, emb_ref)
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-6, atol=1e-10)


def test_margin_class_beta_matches_reference():
    emb, labels = batch("singleton")
    loss = build("margin", beta_mode="class", num_classes=4, nu=0.05)
    with torch.no_grad():
        loss.beta_class.copy_(torch.tensor([0.1, -0.2, 0.0, 0.3]))
    offsets = loss.beta_class.detach().tolist()
    expected = ref_margin(emb, labels, beta=lambda c: 1.2 + offsets[c], nu=0.05)
    torch.testing.assert_close(loss(emb, labels), expected, rtol=1e-6, atol=1e-12)


def test_margin_image_beta_matches_reference():
    emb, labels = batch("singleton")
    loss = build("margin", beta_mode="image", num_classes=4, num_images=40, nu=0.05)
    indices = torch.randperm(40, generator=torch.Generator().manual_seed(3))[: len(labels)]
    with torch.no_grad():
        loss.beta_class.copy_(torch.tensor([0.1, -0.2, 0.0, 0.3]))
        loss.beta_image.copy_(torch.linspace(-0.3, 0.3, 40))
    offsets, per_image = loss.beta_class.detach().tolist(), loss.beta_image.detach()[indices].tolist()
    expected = ref_margin(emb, labels, beta=lambda c: 1.2 + offsets[c], nu=0.05, image=per_image)
    torch.testing.assert_close(loss(emb, labels, indices=indices), expected, rtol=1e-6, atol=1e-12)
    loss(emb.float(), labels, indices=indices).backward()
    assert loss.beta_image.grad[indices].abs().sum() > 0
    untouched = torch.ones(40, dtype=torch.bool)
    untouched[indices] = False
    assert loss.beta_image.grad[untouched].abs().sum() == 0
    with pytest.raises(ValueError, match="indices"):
        loss(emb, labels)
    with pytest.raises(ValueError, match="num_images"):
        build("margin", beta_mode="image", num_classes=4)


@pytest.mark.parametrize(
    ("name", "params"),
    [(n, p) for n, p, _ in CASES if n != "balanced_contrastive"]
    + [("balanced_contrastive", {"class_counts": {0: 5, 1: 3, 2: 4}})],
)
def test_gradcheck(name, params):
    gen = torch.Generator().manual_seed(1)
    emb = torch.randn(7, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 2])
    loss = build(name, **params)
    assert torch.autograd.gradcheck(lambda e: loss(e, labels), (emb,))


@pytest.mark.parametrize(("name", "params", "reference"),
                         [case for case in CASES if case[0] in ("triplet", "triplet_l2", "margin", "dro_kl",
                                                                  "contrastive", "dro_topk")])
def test_pair_weights_are_the_loss_gradient_in_s(name, params, reference):
    """|dL/dS| from pair_weights, signed (positives pull, negatives push) and taken back through S = f f^T and
    f = e/|e| by the chain rule, is the gradient of the slow loop reference with respect to the embeddings
    (S is symmetric, so this sees W_ij + W_ji of each pair)."""
    emb, labels = batch("unbalanced")
    weights = build(name, **params).pair_weights(emb, labels)
    same = labels[:, None] == labels[None, :]
    assert torch.all(weights.diagonal() == 0)
    signed = torch.where(same, -weights, weights)  # dL/dS_ij: a positive pair's loss falls as S_ij grows
    emb_ref = emb.detach().clone().requires_grad_(True)
    f = emb_ref / emb_ref.norm(dim=1, keepdim=True)
    (through_s,) = torch.autograd.grad(f, emb_ref, (signed + signed.t()) @ f.detach())
    (expected,) = torch.autograd.grad(reference(emb_ref, labels), emb_ref)
    torch.testing.assert_close(through_s, expected, rtol=1e-6, atol=1e-10)


def test_npair_reads_only_its_block_of_s_and_weighs_pairs_by_the_full_matrix_gradient():
    emb, labels = batch("singleton")
    loss = build("npair")
    anchors = torch.tensor([a for a, _ in npair_anchors_ref(labels)])
    positives = torch.tensor([p for _, p in npair_anchors_ref(labels)])
    assert loss.used_similarity(emb, labels).shape == (2, 2)  # classes 0 and 1; 2 and 3 have one image
    sim = (emb.detach() @ emb.detach().t()).requires_grad_(True)
    (expected,) = torch.autograd.grad(ref_npair_from_sim(sim, labels), sim)
    weights = loss.pair_weights(emb, labels)
    torch.testing.assert_close(weights, expected.abs(), rtol=1e-6, atol=1e-15)
    block = torch.zeros_like(weights, dtype=torch.bool)
    block[anchors[:, None], positives[None, :]] = True
    assert torch.all(weights[block] > 0) and torch.all(weights[~block] == 0)


def test_margin_pair_weights_take_the_per_image_betas():
    emb, labels = batch("singleton")
    loss = build("margin", beta_mode="image", num_classes=4, num_images=20)
    with torch.no_grad():
        loss.beta_image[:10] = 0.5
    zero, offset = torch.arange(10, 18), torch.arange(0, 8)
    plain = loss.pair_weights(emb, labels, indices=zero)
    torch.testing.assert_close(plain, build("margin").pair_weights(emb, labels), rtol=1e-6, atol=1e-15)
    assert not torch.equal(loss.pair_weights(emb, labels, indices=offset), plain)
    with pytest.raises(ValueError, match="indices"):
        loss.pair_weights(emb, labels)


# ---- limits and identities -------------------------------------------------------------------


def test_dro_kl_tends_to_mean_and_max():
    emb, labels = batch("unbalanced")
    values = torch.stack([v for v, _ in dro_pair_ref(emb.detach(), labels)])
    large = build("dro_kl", gamma=1e4)(emb, labels)
    small = build("dro_kl", gamma=1e-4)(emb, labels)
    torch.testing.assert_close(large, values.mean(), rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(small, values.max(), rtol=0, atol=1e-3)
    assert small > large


def test_dro_topk_with_all_pairs_is_the_mean():
    emb, labels = batch("balanced")
    base = build("dro_topk", k=10**6)(emb, labels)
    values = torch.stack([v for v, _ in dro_pair_ref(emb.detach(), labels)])
    torch.testing.assert_close(base, values.mean())
    exact = build("dro_topk", k=len(labels) * (len(labels) - 1))(emb, labels)
    torch.testing.assert_close(exact, values.mean())


def test_dro_with_registered_base_and_weightings_on_any_pair_loss():
    emb, labels = batch("singleton")
    contrastive = build("contrastive", margin=0.8)
    plain = contrastive(emb, labels)
    topk_all = build("dro_topk", k=10**6, base="contrastive", base_params={"margin": 0.8})
    torch.testing.assert_close(topk_all(emb, labels), plain)
    torch.testing.assert_close(contrastive(emb, labels, weighting=TopKWeighting(10**6)), plain)
    pn = contrastive(emb, labels, weighting=TopKPNWeighting(6))
    assert torch.isfinite(pn) and pn >= contrastive(emb, labels, weighting=TopKWeighting(1)) / 2
    kl = contrastive(emb, labels, weighting=KLWeighting(1e4))
    torch.testing.assert_close(kl, plain, rtol=1e-3, atol=1e-6)
    context = TrainContext(np.repeat(list(COUNTS), list(COUNTS.values())), COUNTS, len(COUNTS), sum(COUNTS.values()))
    balanced = build("dro_kl", context, base="balanced_contrastive")  # the base gets the training context
    assert (balanced.base.counts.tolist() == [COUNTS[k] for k in sorted(COUNTS)]
            and torch.isfinite(balanced(emb, labels)))


def test_balanced_contrastive_with_eq17_lambda_is_contrastive():
    # eq. 17: lam_ij = N_{y_j} (L - 1) / (N_{y_i} - 1); one value when all classes have N images
    n_images, n_classes = 6, 5
    lam = n_images * (n_classes - 1) / (n_images - 1)
    counts = {c: n_images for c in range(n_classes)}
    for structure in ("balanced", "unbalanced"):
        emb, labels = batch(structure)
        balanced = build(
            "balanced_contrastive", class_counts=counts, num_classes=n_classes, lam=lam
        )
        torch.testing.assert_close(balanced(emb, labels), build("contrastive")(emb, labels))
    weighted = build("weighted_contrastive", eta=1.0)(emb, labels)
    torch.testing.assert_close(weighted, build("contrastive")(emb, labels))


def test_margin_param_groups():
    assert build("margin").param_groups(0.1) == []
    groups = build("margin", beta_mode="learned").param_groups(0.1)
    assert len(groups) == 1 and groups[0]["lr"] == 0.0005 and len(groups[0]["params"]) == 1
    groups = build("margin", beta_mode="class", num_classes=3, beta_lr=None).param_groups(0.1)
    assert groups[0]["lr"] == 0.1 and groups[0]["params"][0].shape == (3,)


# ---- pytorch-metric-learning oracles ---------------------------------------------------------


def pml_batch(seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 0, 4])
    return torch.randn(len(labels), 8, generator=gen, dtype=torch.float64), labels


def test_contrastive_matches_pml():
    """PML's negative hinge is not squared, so no single configuration matches: the per-pair
    losses (DoNothingReducer) of two configurations are combined and averaged over all pairs."""
    pytest.importorskip("pytorch_metric_learning")
    from pytorch_metric_learning.distances import CosineSimilarity, LpDistance
    from pytorch_metric_learning.losses import ContrastiveLoss
    from pytorch_metric_learning.reducers import DoNothingReducer

    emb, labels = pml_batch()
    # PML's hinge is not squared: D^2 from a power-2 distance for positives, [a - D]_+ squared
    pos = ContrastiveLoss(pos_margin=0, distance=LpDistance(power=2), reducer=DoNothingReducer())
    neg = ContrastiveLoss(neg_margin=0.9, reducer=DoNothingReducer())
    pos_losses = pos(emb, labels)["pos_loss"]["losses"]
    neg_losses = neg(emb, labels)["neg_loss"]["losses"] ** 2
    expected = torch.cat([pos_losses, neg_losses]).mean()
    ours = build("contrastive", margin=0.9)(emb, labels)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=0)
    # similarity form: with pos_margin = 1, PML's [1 - S]_+ = 1 - S on positives, one more than ours
    cos = ContrastiveLoss(pos_margin=1, neg_margin=0.5, distance=CosineSimilarity(),
                          reducer=DoNothingReducer())
    out = cos(emb, labels)
    both = torch.cat([out["pos_loss"]["losses"] - 1, out["neg_loss"]["losses"]])
    ours = build("contrastive", form="similarity")(emb, labels)
    torch.testing.assert_close(ours, both.mean(), rtol=1e-5, atol=0)


@pytest.mark.parametrize(("name", "power"), [("triplet", 2), ("triplet_l2", 1)])
def test_triplet_matches_pml(name, power):
    pytest.importorskip("pytorch_metric_learning")
    from pytorch_metric_learning.distances import LpDistance
    from pytorch_metric_learning.losses import TripletMarginLoss
    from pytorch_metric_learning.reducers import MeanReducer

    emb, labels = pml_batch()
    pml = TripletMarginLoss(margin=0.2, distance=LpDistance(power=power), reducer=MeanReducer())
    ours = build(name)
    torch.testing.assert_close(ours(emb, labels), pml(emb, labels), rtol=1e-5, atol=0)
    triplets = (torch.tensor([0, 1, 4, 5]), torch.tensor([4, 5, 8, 1]), torch.tensor([1, 2, 3, 12]))
    torch.testing.assert_close(
        ours(emb, labels, Mined(triplets=triplets)), pml(emb, labels, triplets), rtol=1e-5, atol=0
    )


def one_triplet_per_anchor(labels: torch.Tensor, seed: int = 0):
    """One (anchor, positive, negative) per image that has a positive, and the matching masks."""
    gen = torch.Generator().manual_seed(seed)
    same = labels[:, None] == labels[None, :]
    anchors, positives, negatives = [], [], []
    for a in range(len(labels)):
        pos = [p for p in range(len(labels)) if same[a, p] and p != a]
        neg = [n for n in range(len(labels)) if not same[a, n]]
        if pos:
            anchors.append(a)
            positives.append(pos[int(torch.randint(len(pos), (1,), generator=gen))])
            negatives.append(neg[int(torch.randint(len(neg), (1,), generator=gen))])
    a, p, n = (torch.tensor(v) for v in (anchors, positives, negatives))
    pos_mask = torch.zeros(len(labels), len(labels), dtype=torch.bool)
    neg_mask = torch.zeros_like(pos_mask)
    pos_mask[a, p] = True
    neg_mask[a, n] = True
    return (a, p, n), Mined(pos=pos_mask, neg=neg_mask)


@pytest.mark.parametrize("mode", ["fixed", "learned", "class"])
def test_margin_matches_pml(mode):
    """PML's MarginLoss works on triplets; with one triplet per anchor and the same pairs as masks
    the pair losses, the non-zero count and (nu counted once per triplet there, once per pair
    here: PML's nu doubled) the regulariser coincide."""
    pytest.importorskip("pytorch_metric_learning")
    from pytorch_metric_learning.losses import MarginLoss as PMLMarginLoss

    emb, labels = pml_batch()
    emb = (emb * 0.6).requires_grad_(True)  # a mix of zero and non-zero pair losses
    triplets, mined = one_triplet_per_anchor(labels)
    nu = 0.0 if mode != "class" else 0.01
    classes = 5 if mode == "class" else None
    pml = PMLMarginLoss(margin=0.2, beta=1.2, nu=2 * nu, learn_beta=mode != "fixed",
                        num_classes=classes)
    ours = build("margin", beta_mode=mode, nu=nu, num_classes=classes)
    expected = pml(emb, labels, triplets)
    value = ours(emb, labels, mined)
    torch.testing.assert_close(value, expected.to(value.dtype), rtol=1e-5, atol=0)
    if mode != "fixed":
        (g_pml,) = torch.autograd.grad(expected, pml.beta)
        (g_ours,) = torch.autograd.grad(value, ours.beta0 if mode == "learned" else ours.beta_class)
        torch.testing.assert_close(g_ours.reshape(g_pml.shape), g_pml, rtol=1e-5, atol=1e-7)


def test_npair_matches_pml():
    pytest.importorskip("pytorch_metric_learning")
    from pytorch_metric_learning.distances import DotProductSimilarity
    from pytorch_metric_learning.losses import NPairsLoss

    emb, labels = pml_batch()
    pml = NPairsLoss(distance=DotProductSimilarity(normalize_embeddings=False))
    torch.testing.assert_close(build("npair", l2_reg=0.0)(emb, labels), pml(emb, labels),
                               rtol=1e-5, atol=0)


# ---- degenerate batches, bad arguments, autocast ---------------------------------------------

ALL = [
    ("contrastive", {}), ("contrastive", {"form": "similarity"}), ("weighted_contrastive", {}),
    ("balanced_contrastive", {"class_counts": COUNTS}), ("triplet", {}), ("triplet_l2", {}),
    ("margin", {}), ("margin", {"beta_mode": "class", "num_classes": 4, "nu": 0.1}),
    ("npair", {"l2_reg": 0.0}), ("dro_topk", {}), ("dro_topk_pn", {}), ("dro_kl", {}),
]
NO_PAIR_TERMS = {"triplet", "triplet_l2", "npair"}  # losses without any term unless pos and neg


DEGENERATE = {
    "no_positives": ([0, 1, 2, 3], torch.randn),
    "no_negatives": ([1, 1, 1], torch.randn),
    "identical_no_negatives": ([0, 0, 0, 0], torch.ones),  # D = 0 everywhere
    "single": ([2], torch.randn),
}


@pytest.mark.parametrize(("name", "params"), ALL)
@pytest.mark.parametrize("case", sorted(DEGENERATE))
def test_degenerate_batches_are_finite_with_graph(name, params, case):
    labels, make = DEGENERATE[case]
    labels = torch.tensor(labels)
    emb = make(len(labels), 6).requires_grad_(True)
    loss = build(name, **params)(emb, labels)
    assert loss.dim() == 0 and torch.isfinite(loss) and loss.requires_grad
    (grad,) = torch.autograd.grad(loss, emb)
    assert torch.isfinite(grad).all()
    if case == "single" or name in NO_PAIR_TERMS:
        assert loss == 0


@pytest.mark.parametrize(
    ("name", "params", "parameter"),
    [
        ("contrastive", {"margin": -1.0}, "margin"),
        ("contrastive", {"form": "cosine"}, "form"),
        ("weighted_contrastive", {"eta": 0.0}, "eta"),
        ("balanced_contrastive", {}, "class_counts"),
        ("balanced_contrastive", {"class_counts": {0: 3}}, "num_classes"),
        ("balanced_contrastive", {"class_counts": COUNTS, "lam": -2.0}, "lam"),
        ("triplet", {"margin": -0.1}, "margin"),
        ("triplet_l2", {"margin": -0.1}, "margin"),
        ("margin", {"margin": -0.2}, "margin"),
        ("margin", {"beta_mode": "image"}, "beta_mode"),
        ("margin", {"beta_mode": "class"}, "num_classes"),
        ("margin", {"nu": -1.0}, "nu"),
        ("npair", {"l2_reg": -1.0}, "l2_reg"),
        ("dro_topk", {"k": 0}, "k"),
        ("dro_topk", {"k": 2.5}, "k"),
        ("dro_topk_pn", {"k": 1}, "k"),
        ("dro_kl", {"gamma": 0.0}, "gamma"),
        ("dro_kl", {"base": "contrastivee"}, "base"),
        ("dro_kl", {"base": "triplet"}, "base"),
        ("dro_topk", {"base_params": {"margin": -1.0}}, "margin"),
    ],
)
def test_bad_arguments_raise(name, params, parameter):
    with pytest.raises(ValueError, match=parameter):
        build(name, **params)


def test_labels_outside_class_tables_raise():
    emb, labels = batch("singleton")
    with pytest.raises(ValueError, match="class_counts"):
        build("balanced_contrastive", class_counts={0: 3, 1: 4})(emb, labels)
    with pytest.raises(ValueError, match="num_classes"):
        build("margin", beta_mode="class", num_classes=2)(emb, labels)


@pytest.mark.parametrize(("name", "params"), ALL + [("npair", {})])
def test_bfloat16_autocast_is_close_to_float32(name, params):
    torch.manual_seed(0)
    net = torch.nn.Linear(16, 8)
    x = torch.randn(12, 16)
    labels = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    loss = build(name, **params)
    reference = loss(net(x), labels)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        emb = net(x)
        value = loss(emb, labels)
    assert emb.dtype == torch.bfloat16 and value.dtype == torch.float32
    assert torch.isfinite(value)
    value.backward()
    assert all(torch.isfinite(p.grad).all() for p in net.parameters())
    assert math.isclose(value.item(), reference.item(), rel_tol=0.1, abs_tol=0.02)
