"""The proxy losses beyond the five papers against pytorch-metric-learning (same proxies copied in), loop references
of their formulas and gradcheck; edge batches, parameters, the random sampler and the listing."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pytest
import torch
from torch import Tensor

from metricsearch.train.losses import ProxyLoss, build, learns_proxies, names
from metricsearch.train.components import check_compatible
from metricsearch.train.miners import build_miner
from metricsearch.train.samplers import build_sampler
from metricsearch.train.weightings import build_weighting

PROXY_LOSSES = ["arcface", "cosface", "normsoftmax", "proxy_anchor", "proxy_nca", "soft_triple"]
CLASSES, DIM = 5, 6
#: class 3 has no image in the batch (Proxy-Anchor's P+ is then smaller than P); class 0 has one
LABELS = [1, 1, 1, 2, 2, 0, 4, 4, 4, 4, 2, 1]

# ---------------------------------------------------------------- loop references (float64)


def unit(x: Tensor) -> Tensor:
    """A vector scaled to length 1, written out."""
    return x / torch.sqrt((x * x).sum())


def cos(x: Tensor, w: Tensor) -> Tensor:
    """The cosine of two vectors."""
    return (unit(x) * unit(w)).sum()


def lse(terms: list[Tensor]) -> Tensor:
    """log sum exp of a non-empty list of scalars, written out."""
    top = max(float(t.detach()) for t in terms)
    return top + torch.log(sum(torch.exp(t - top) for t in terms))


def nll(logits: list[Tensor], target: int) -> Tensor:
    """-log softmax(logits)[target]."""
    return lse(logits) - logits[target]


def ref_proxy_anchor(emb: Tensor, proxies: Tensor, y: list[int], alpha: float = 32.0, delta: float = 0.1) -> Tensor:
    """Proxy-Anchor eq. 4: per proxy, log(1 + sum e^...) over its positives and over its negatives."""
    pulled, pushed, with_pos = emb.new_zeros(()), emb.new_zeros(()), 0
    for p in range(len(proxies)):
        pos = [-alpha * (cos(emb[i], proxies[p]) - delta) for i in range(len(y)) if y[i] == p]
        neg = [alpha * (cos(emb[i], proxies[p]) + delta) for i in range(len(y)) if y[i] != p]
        if pos:
            pulled, with_pos = pulled + torch.log(1 + sum(torch.exp(t) for t in pos)), with_pos + 1
        if neg:
            pushed = pushed + torch.log(1 + sum(torch.exp(t) for t in neg))
    return pulled / with_pos + pushed / len(proxies)


def ref_proxy_nca(emb: Tensor, proxies: Tensor, y: list[int], temperature: float = 1 / 9) -> Tensor:
    """ProxyNCA++: -log softmax over all proxies of -||f/|f| - p/|p|||^2 / T, the own proxy included."""
    total = emb.new_zeros(())
    for i in range(len(y)):
        logits = [-((unit(emb[i]) - unit(p)) ** 2).sum() / temperature for p in proxies]
        total = total + nll(logits, y[i])
    return total / len(y)


def ref_soft_triple(emb: Tensor, proxies: Tensor, y: list[int], k: int = 10, la: float = 20.0, gamma: float = 0.1,
                    tau: float = 0.2, delta: float = 0.01) -> Tensor:
    """SoftTriple: relaxed similarity per class, cross-entropy with the margin, plus the centres' regulariser."""
    classes = len(proxies) // k
    total = emb.new_zeros(())
    for i in range(len(y)):
        logits = []
        for c in range(classes):
            sims = [cos(emb[i], proxies[c * k + j]) for j in range(k)]
            weights = [torch.exp(s / gamma) for s in sims]
            relaxed = sum(w * s for w, s in zip(weights, sims)) / sum(weights)
            logits.append(la * (relaxed - (delta if c == y[i] else 0.0)))
        total = total + nll(logits, y[i])
    reg = emb.new_zeros(())
    for c in range(classes):
        for a in range(k):
            for b in range(a + 1, k):
                reg = reg + torch.sqrt(2 + 1e-5 - 2 * cos(proxies[c * k + a], proxies[c * k + b]))
    return total / len(y) + tau * reg / (classes * k * (k - 1))


def ref_softmax(kind: str, scale: float, margin: float = 0.0, k: int = 1) -> Callable[..., Tensor]:
    """NormSoftmax, CosFace or ArcFace: cross-entropy of scale x class cosines (the largest of a class's k)."""

    def loss(emb: Tensor, proxies: Tensor, y: list[int]) -> Tensor:
        total = emb.new_zeros(())
        for i in range(len(y)):
            logits = []
            for c in range(len(proxies) // k):
                s = max((cos(emb[i], proxies[c * k + j]) for j in range(k)), key=lambda t: float(t.detach()))
                if c == y[i] and kind == "cosface":
                    s = s - margin
                elif c == y[i] and kind == "arcface":
                    theta = torch.acos(s)
                    s = torch.cos(theta + margin) if theta + margin <= math.pi else s - margin * math.sin(margin)
                logits.append(scale * s)
            total = total + nll(logits, y[i])
        return total / len(y)

    return loss


# ---------------------------------------------------------------- the cases

# case -> (loss name, parameters, loop reference)
CASES: dict[str, tuple[str, dict, Callable[..., Tensor]]] = {
    "proxy_anchor": ("proxy_anchor", {}, ref_proxy_anchor),
    "proxy_nca": ("proxy_nca", {}, ref_proxy_nca),
    "soft_triple": ("soft_triple", {}, ref_soft_triple),
    "soft_triple_k3": ("soft_triple", {"centers_per_class": 3}, lambda e, p, y: ref_soft_triple(e, p, y, k=3)),
    "normsoftmax": ("normsoftmax", {}, ref_softmax("normsoftmax", 1 / 0.05)),
    "cosface": ("cosface", {}, ref_softmax("cosface", 64.0, 0.35)),
    "cosface_sub3": ("cosface", {"sub_centers": 3}, ref_softmax("cosface", 64.0, 0.35, k=3)),
    "arcface": ("arcface", {}, ref_softmax("arcface", 64.0, 0.5)),
    "arcface_sub3": ("arcface", {"sub_centers": 3}, ref_softmax("arcface", 64.0, 0.5, k=3)),
}


def make(case: str, classes: int = CLASSES, dim: int = DIM, seed: int = 0) -> ProxyLoss:
    """The loss of a case in float64, its proxies drawn with `seed`."""
    name, params, _ = CASES[case]
    torch.manual_seed(seed)
    return build(name, num_classes=classes, embedding_dim=dim, **params).double()


def batch(seed: int, labels: list[int] = LABELS, dim: int = DIM) -> tuple[Tensor, Tensor]:
    """Float64 embeddings (not unit length) and their labels."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(len(labels), dim, generator=g, dtype=torch.float64) * 3, torch.tensor(labels)


def value_and_grads(fn: Callable[[Tensor, Tensor], Tensor], emb: Tensor, proxies: Tensor) -> tuple[Tensor, ...]:
    """fn(embeddings, proxies) and its gradients with respect to both."""
    e, p = emb.clone().requires_grad_(True), proxies.detach().clone().requires_grad_(True)
    value = fn(e, p)
    return (value.detach(), *torch.autograd.grad(value, (e, p)))


def ours(loss: ProxyLoss, labels: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
    """The loss as a function of the embeddings and the proxies."""
    return lambda e, p: torch.func.functional_call(loss, {"proxies": p}, (e, labels))


# ---------------------------------------------------------------- against the loop references


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", list(CASES))
def test_value_and_gradients_match_the_loop_reference(case: str, seed: int) -> None:
    loss = make(case, seed=seed)
    emb, labels = batch(seed)
    got = value_and_grads(ours(loss, labels), emb, loss.proxies)
    expected = value_and_grads(lambda e, p: CASES[case][2](e, p, LABELS), emb, loss.proxies)
    assert got[0].dtype == torch.float64 and got[0] > 0
    for mine, theirs in zip(got, expected):
        torch.testing.assert_close(mine, theirs, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("case", list(CASES))
def test_gradcheck_in_embeddings_and_proxies(case: str) -> None:
    loss = make(case, classes=3, dim=4, seed=2)
    emb, labels = batch(2, [0, 0, 1, 2, 2, 2], dim=4)
    proxies = loss.proxies.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(ours(loss, labels), (emb.requires_grad_(True), proxies), eps=1e-6, atol=1e-5)


# ---------------------------------------------------------------- against pytorch-metric-learning


def pml_loss(case: str, loss: ProxyLoss):
    """PML's implementation of a case with our proxies copied in (its class weights are their transpose)."""
    pytest.importorskip("pytorch_metric_learning")
    from pytorch_metric_learning import losses, regularizers

    proxies = loss.proxies.detach().clone()
    c = CLASSES
    if case == "proxy_anchor":
        theirs = losses.ProxyAnchorLoss(c, DIM, margin=0.1, alpha=32)
    elif case == "proxy_nca":
        theirs = losses.ProxyNCALoss(c, DIM, softmax_scale=9)  # 1 / T on squared distances of unit vectors
    elif case in ("soft_triple", "soft_triple_k3"):
        k = loss.per_class
        theirs = losses.SoftTripleLoss(c, DIM, centers_per_class=k, la=20, gamma=0.1, margin=0.01,
                                       weight_regularizer=regularizers.SparseCentersRegularizer(c, k),
                                       weight_reg_weight=0.2)
    elif case == "normsoftmax":
        theirs = losses.NormalizedSoftmaxLoss(c, DIM, temperature=0.05)
    elif case == "cosface":
        theirs = losses.CosFaceLoss(c, DIM, margin=0.35, scale=64)
    elif case == "arcface":
        theirs = losses.ArcFaceLoss(c, DIM, margin=math.degrees(0.5), scale=64)  # PML takes degrees
    else:
        theirs = losses.SubCenterArcFaceLoss(num_classes=c, embedding_size=DIM, margin=math.degrees(0.5), scale=64,
                                             sub_centers=3)
    weights = [p for p in theirs.parameters()]
    assert len(weights) == 1
    transposed = weights[0].shape != proxies.shape
    weights[0].data = (proxies.t() if transposed else proxies).clone()
    return theirs, weights[0], transposed


@pytest.mark.parametrize("case", [c for c in CASES if c != "cosface_sub3"])  # PML has no sub-centre CosFace
def test_value_and_gradients_match_pml_with_the_same_proxies(case: str) -> None:
    loss = make(case, seed=3)
    emb, labels = batch(3)
    theirs, weight, transposed = pml_loss(case, loss)
    e = emb.clone().requires_grad_(True)
    value = theirs(e, labels)
    value.backward()
    proxy_grad = weight.grad.t() if transposed else weight.grad
    got = value_and_grads(ours(loss, labels), emb, loss.proxies)
    # SoftTriple: PML's regulariser adds the smallest float64 under its square root where the released code (and
    # ours) adds 1e-5
    rtol = 1e-5 if case.startswith("soft_triple") else 1e-7
    for mine, theirs_ in zip(got, (value.detach(), e.grad, proxy_grad)):
        torch.testing.assert_close(mine, theirs_.to(mine.dtype), rtol=rtol, atol=1e-9)


# ---------------------------------------------------------------- edge batches


@pytest.mark.parametrize("name", PROXY_LOSSES)
@pytest.mark.parametrize("labels", [[2], [1, 1, 1, 1], [0, 1, 2, 3]], ids=["one", "one_class", "every_class_once"])
def test_edge_batches_are_finite_with_gradients(name: str, labels: list[int]) -> None:
    torch.manual_seed(0)
    loss = build(name, num_classes=4, embedding_dim=8)
    emb = torch.randn(len(labels), 8, requires_grad=True)
    value = loss(emb, torch.tensor(labels))
    value.backward()
    assert value.requires_grad and torch.isfinite(value)
    assert torch.isfinite(emb.grad).all() and torch.isfinite(loss.proxies.grad).all()
    assert loss.proxies.grad.abs().sum() > 0


#: each loss's scale (or inverse temperature) 100 times the paper's
HUGE = {"arcface": {"scale": 6400.0}, "cosface": {"scale": 6400.0}, "normsoftmax": {"temperature": 0.0005},
        "proxy_anchor": {"alpha": 3200.0}, "proxy_nca": {"temperature": 1 / 900}, "soft_triple": {"la": 2000.0,
                                                                                                "gamma": 0.001}}


@pytest.mark.parametrize("name", PROXY_LOSSES)
def test_huge_scales_do_not_overflow_float32(name: str) -> None:
    torch.manual_seed(0)
    loss = build(name, num_classes=8, embedding_dim=16, **HUGE[name])
    emb = torch.randn(32, 16, requires_grad=True)
    labels = torch.arange(8).repeat_interleave(4)
    with torch.no_grad():  # embeddings on their own proxies and far off them
        loss.proxies[:4] = emb[:16:4].detach()
    value = loss(emb * 1e4, labels)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(emb.grad).all() and torch.isfinite(loss.proxies.grad).all()


@pytest.mark.parametrize("name", PROXY_LOSSES)
def test_bfloat16_autocast_is_float32_and_finite(name: str) -> None:
    torch.manual_seed(0)
    layer, loss = torch.nn.Linear(16, 8), build(name, num_classes=8, embedding_dim=8)
    x, labels = torch.randn(32, 16), torch.arange(8).repeat_interleave(4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        emb = layer(x)
        low = loss(emb, labels)
    assert emb.dtype == torch.bfloat16 and low.dtype == torch.float32
    low.backward()
    assert torch.isfinite(low) and all(torch.isfinite(p.grad).all() for p in [*layer.parameters(), loss.proxies])
    torch.testing.assert_close(low, loss(emb.detach().float(), labels), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- parameters and contracts


def test_the_papers_defaults_and_the_registry() -> None:
    assert [n for n in names() if learns_proxies(n)] == PROXY_LOSSES
    expected = {"proxy_anchor": {"alpha": 32.0, "margin": 0.1}, "proxy_nca": {"temperature": 1 / 9},
                "soft_triple": {"centers_per_class": 10, "la": 20.0, "gamma": 0.1, "reg_weight": 0.2, "margin": 0.01},
                "normsoftmax": {"temperature": 0.05}, "cosface": {"margin": 0.35, "scale": 64.0, "sub_centers": 1},
                "arcface": {"margin": 0.5, "scale": 64.0, "sub_centers": 1}}
    for name, defaults in expected.items():
        loss = build(name, num_classes=3, embedding_dim=2)
        assert loss.proxy_lr_factor == 100.0 and loss.mines == "none"
        for key, value in defaults.items():
            assert (loss.per_class if key in ("centers_per_class", "sub_centers") else getattr(loss, key)) == value
    assert build("soft_triple", num_classes=3, embedding_dim=2).proxies.shape == (30, 2)
    assert build("arcface", num_classes=3, embedding_dim=2, sub_centers=3).proxies.shape == (9, 2)


@pytest.mark.parametrize("name, params, named", [
    ("proxy_anchor", {"num_classes": None}, "num_classes"), ("proxy_anchor", {"embedding_dim": 0}, "embedding_dim"),
    ("proxy_anchor", {"alpha": 0.0}, "alpha"), ("proxy_anchor", {"margin": -0.1}, "margin"),
    ("proxy_nca", {"temperature": 0.0}, "temperature"), ("normsoftmax", {"temperature": -1.0}, "temperature"),
    ("soft_triple", {"centers_per_class": 0}, "centers_per_class"), ("soft_triple", {"gamma": 0.0}, "gamma"),
    ("soft_triple", {"reg_weight": -0.2}, "reg_weight"), ("soft_triple", {"la": math.inf}, "la"),
    ("cosface", {"sub_centers": 0}, "sub_centers"), ("cosface", {"scale": 0.0}, "scale"),
    ("arcface", {"margin": 4.0}, "margin"), ("arcface", {"proxy_lr_factor": 0.0}, "proxy_lr_factor"),
])
def test_bad_parameters_raise_naming_them(name: str, params: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        build(name, **{"num_classes": 3, "embedding_dim": 2, **params})


def test_labels_without_a_proxy_and_other_dimensions_are_refused() -> None:
    loss = build("proxy_anchor", num_classes=3, embedding_dim=4)
    with pytest.raises(ValueError, match="num_classes=3"):
        loss(torch.randn(2, 4), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="embedding_dim"):
        loss(torch.randn(2, 5), torch.tensor([0, 1]))


def test_miners_and_weightings_are_refused_at_start_up() -> None:
    loss = build("cosface", num_classes=3, embedding_dim=4)
    with pytest.raises(ValueError, match="ignores mined pairs"):
        check_compatible(loss, build_miner("ms"))
    with pytest.raises(ValueError, match="does not take a pair weighting"):
        check_compatible(loss, weighting=build_weighting("dro_kl"))
    with pytest.raises(ValueError, match="needs the whole batch"):
        check_compatible(loss, sampler=build_sampler("p_random", np.arange(20) % 4))


def test_the_optimizer_gives_the_proxies_their_own_rate() -> None:
    from metricsearch.models.torch_embedder import build_embedder
    from metricsearch.train.optim import build_optimizer

    model = build_embedder({"backbone": "small_cnn", "dim": 8})
    section = {"name": "adamw", "lr": 0.0001, "head_lr": 0.001}
    for factor in (100.0, 10.0):
        loss = build("proxy_anchor", num_classes=3, embedding_dim=8, proxy_lr_factor=factor)
        groups = build_optimizer(section, model, loss).param_groups
        assert [g["lr"] for g in groups] == pytest.approx([0.0001, 0.001, 0.0001 * factor])
        assert groups[-1]["params"] == [loss.proxies]


def test_pair_weights_are_over_embedding_proxy_pairs(tmp_path) -> None:
    from metricsearch.train.losses.pair_weight_plots import inspect_loss

    torch.manual_seed(0)
    loss = build("soft_triple", num_classes=CLASSES, embedding_dim=DIM, centers_per_class=2)
    emb, labels = batch(0)
    sim, weights, own, other = loss.weighted_pairs(emb.float(), labels)
    assert sim.shape == weights.shape == own.shape == (len(LABELS), 2 * CLASSES)
    assert torch.equal(own, labels[:, None] == torch.arange(2 * CLASSES)[None, :] // 2) and torch.equal(other, ~own)
    # |dL/dS| by autograd: the loss moves with every similarity to a proxy
    assert (weights > 0).all()
    out = inspect_loss(["proxy_anchor", "ms"], tmp_path / "weights.png", classes=4, per_class=4, dim=8)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- the random sampler


def test_random_batches_are_seeded_split_over_ranks_and_hold_distinct_images() -> None:
    labels = np.repeat(np.arange(10), 7)

    def epoch(seed: int, ep: int, rank: int = 0, world: int = 1) -> list[list[int]]:
        sampler = build_sampler("random", labels, batch_size=16, seed=seed, rank=rank, world_size=world,
                                batches_per_epoch=6 // world)
        sampler.set_epoch(ep)
        return list(sampler)

    whole = epoch(0, 1)
    assert whole == epoch(0, 1) and whole != epoch(0, 2) and whole != epoch(1, 1)
    assert epoch(0, 1, 0, 2) == whole[0::2] and epoch(0, 1, 1, 2) == whole[1::2]
    assert all(len(b) == len(set(b)) == 16 and all(0 <= i < 70 for i in b) for b in whole)
    assert len(build_sampler("random", labels, batch_size=16)) == 70 // 16
    with pytest.raises(ValueError, match="batch_size"):
        build_sampler("random", labels, batch_size=71)


def test_listing_shows_the_proxy_losses_apart(capsys) -> None:
    from metricsearch.app.cli import main

    assert main(["losses"]) == 0
    papers, beyond = capsys.readouterr().out.split("losses beyond the five papers")
    assert "  ms " in papers and not any(f"  {name} " in papers for name in PROXY_LOSSES)
    assert all(f"  {name} " in beyond for name in PROXY_LOSSES) and "  ms " not in beyond
    assert "alpha=32.0, margin=0.1, proxy_lr_factor=100.0" in beyond and "num_classes" not in beyond


def test_tensorboard_draws_no_proxy_pairs_of_held_out_classes(tmp_path) -> None:
    pytest.importorskip("tensorboard")
    from metricsearch.data import load_split
    from metricsearch.models.torch_embedder import build_embedder
    from metricsearch.train.tensorboard_log import Board

    torch.manual_seed(0)
    model, loss = build_embedder({"backbone": "small_cnn", "dim": 8}), build("arcface", num_classes=2, embedding_dim=8)
    board = Board(tmp_path)
    board.evaluation(1, model, load_split("digits").test, loss)  # 5 held-out classes, 2 proxies: none of theirs
    board.close()
    assert any((tmp_path / "tensorboard").iterdir()) and not (tmp_path / "pair_weights.png").exists()
