"""Miners: brute-force definitions, the MS loss's own mining, and PML's miners as oracles."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from metricsearch.train.losses.base import Mined, label_masks
from metricsearch.train.losses.ms import ms_mine
from metricsearch.train.miners import MINERS, build_miner
from metricsearch.train.miners.distance_weighted import log_sphere_distance_density


def batch(b: int = 32, dim: int = 16, per_class: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (un-normalised) embeddings and labels with `per_class` images per class."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b, dim, generator=gen) * 3, torch.arange(b) // per_class


def distances(emb: torch.Tensor) -> torch.Tensor:
    """Euclidean distances of the normalised embeddings."""
    return torch.cdist(F.normalize(emb, dim=1), F.normalize(emb, dim=1))


def triplet_set(mined: Mined) -> set[tuple[int, int, int]]:
    """The mined triplets as a set of (a, p, n)."""
    return set(zip(*(t.tolist() for t in mined.triplets)))


def test_all_miners_registered_with_produces() -> None:
    assert set(MINERS.names()) >= {"semihard", "hard", "batch_hard", "distance_weighted", "ms", "random"}
    for name in MINERS.names():
        assert build_miner(name).produces in ("pairs", "triplets")


@pytest.mark.parametrize("margin", [None, 0.2])
def test_semihard_is_the_closest_negative_beyond_the_positive(margin: float | None) -> None:
    emb, labels = batch()
    d = distances(emb)
    pos, neg = label_masks(labels)
    mined = build_miner("semihard", margin=margin)(emb, labels)
    got = {(a, p): n for a, p, n in triplet_set(mined)}
    assert len(got) == len(mined.triplets[0])  # one triplet per (a, p) at most
    for a, p in pos.nonzero().tolist():
        ok = neg[a] & (d[a] > d[a, p])
        if margin is not None:
            ok &= d[a] < d[a, p] + margin
        if not ok.any():
            assert (a, p) not in got
            continue
        n = got[(a, p)]
        assert bool(ok[n]) and d[a, n] == d[a][ok].min()


def test_hard_and_batch_hard() -> None:
    emb, labels = batch()
    d = distances(emb)
    pos, neg = label_masks(labels)
    closest = d.masked_fill(~neg, math.inf).argmin(dim=1)
    farthest = d.masked_fill(~pos, -math.inf).argmax(dim=1)
    hard = triplet_set(build_miner("hard")(emb, labels))
    assert hard == {(a, p, int(closest[a])) for a, p in pos.nonzero().tolist()}
    batch_hard = triplet_set(build_miner("batch_hard")(emb, labels))
    assert batch_hard == {(a, int(farthest[a]), int(closest[a])) for a in range(len(labels))}


def test_miners_respect_given_pairs() -> None:
    emb, labels = batch()
    pos, neg = label_masks(labels)
    gen = torch.Generator().manual_seed(1)
    allowed = Mined(pos=torch.rand(pos.shape, generator=gen) < 0.5, neg=torch.rand(neg.shape, generator=gen) < 0.5)
    for name in ("semihard", "hard", "batch_hard", "distance_weighted"):
        a, p, n = build_miner(name)(emb, labels, allowed).triplets
        assert len(a) and allowed.pos[a, p].all() and allowed.neg[a, n].all() and pos[a, p].all() and neg[a, n].all()
    for name in ("ms", "random"):
        mined = build_miner(name)(emb, labels, allowed)
        assert not (mined.pos & ~(allowed.pos & pos)).any() and not (mined.neg & ~(allowed.neg & neg)).any()


def test_ms_miner_keeps_the_ms_loss_pairs() -> None:
    emb, labels = batch()
    sim = F.normalize(emb, dim=1) @ F.normalize(emb, dim=1).t()
    pos, neg = label_masks(labels)
    kept_pos, kept_neg = ms_mine(sim, pos, neg, 0.1)
    mined = build_miner("ms", epsilon=0.1)(emb, labels)
    assert torch.equal(mined.pos, kept_pos) and torch.equal(mined.neg, kept_neg)
    assert 0 < kept_neg.sum() < neg.sum()  # the check is not vacuous


@pytest.mark.parametrize("produces", ["pairs", "triplets"])
def test_random_miner_fraction_and_seed(produces: str) -> None:
    emb, labels = batch()
    pos, neg = label_masks(labels)
    first = build_miner("random", fraction=0.25, produces=produces, seed=3)(emb, labels)
    again = build_miner("random", fraction=0.25, produces=produces, seed=3)(emb, labels)
    if produces == "pairs":
        assert int((first.pos | first.neg).sum()) == math.ceil(0.25 * int((pos | neg).sum()))
        assert torch.equal(first.pos, again.pos) and torch.equal(first.neg, again.neg)
    else:
        total = int((pos.sum(1) * neg.sum(1)).sum())
        found = triplet_set(first)
        assert len(found) == math.ceil(0.25 * total)
        assert all(bool(pos[a, p] and neg[a, n]) for a, p, n in found)
        assert found == triplet_set(again)


def test_distance_weighted_probabilities_exact() -> None:
    emb, labels = batch(b=12, dim=6, per_class=3)
    miner = build_miner("distance_weighted", cutoff=0.5, nonzero_loss_cutoff=1.4, lam=3.0)
    probs = miner.probabilities(emb, labels).double()
    d = distances(emb).double()
    dim = 6
    _, neg = label_masks(labels)
    for a in range(len(labels)):
        w = torch.zeros(len(labels), dtype=torch.float64)
        for n in range(len(labels)):
            if neg[a, n] and d[a, n] < 1.4:
                x = max(float(d[a, n]), 0.5)
                q = x ** (dim - 2) * (1 - x * x / 4) ** ((dim - 3) / 2) / _beta(0.5, (dim - 1) / 2)
                w[n] = min(3.0, 1 / q)
        expected = w / w.sum() if w.sum() > 0 else w
        assert torch.allclose(probs[a], expected, atol=1e-5), a
    assert (probs.sum(1) > 0).any() and (probs[probs > 0] < probs.max()).any()  # clipping bites


def _beta(x: float, y: float) -> float:
    return math.exp(math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y))


def test_sphere_distance_density_integrates_to_one() -> None:
    d = torch.linspace(1e-4, 2 - 1e-4, 200_001, dtype=torch.float64)
    for dim in (3, 16, 128):
        assert torch.trapezoid(log_sphere_distance_density(d, dim).exp(), d).item() == pytest.approx(1.0, abs=1e-3)


def test_distance_weighted_spreads_negatives() -> None:
    """Sphere-uniform embeddings in dim 128: negatives' distances are ~ N(sqrt 2, 1/256), so uniform
    sampling picks d within a few hundredths of sqrt(2); distance weighted sampling spreads its
    picks over everything the batch offers below 1.4 (about [1.15, 1.4] here: no pair of a batch
    of random points in dim 128 is closer, so [0.5, 1.15) cannot be populated at this dim)."""
    emb, labels = batch(b=512, dim=128, per_class=8, seed=5)
    d = distances(emb)
    a, _, n = build_miner("distance_weighted", seed=0)(emb, labels).triplets
    picked = d[a, n]
    _, neg = label_masks(labels)
    uniform = d[neg]
    assert picked.max() < 1.4 and uniform.std() < 0.07
    assert picked.mean() < uniform.mean() - 0.08  # observed: 1.29 vs 1.41
    edges = torch.linspace(float(uniform.min()), 1.4, 6)
    h_picked = torch.histogram(picked, edges).hist / len(picked)
    h_uniform = torch.histogram(uniform[uniform < 1.4], edges).hist / len(uniform)
    assert (h_picked > 0.05).all()  # every fifth of the available range gets > 5% of the picks
    assert h_picked[:3].sum() > 0.4 and h_uniform[:3].sum() < 0.05  # observed: 51% vs 3.4%


def test_distance_weighted_low_dim_covers_the_range() -> None:
    """In dim 8 pairs are spread over [0, 2]: the picks cover all of [0.5, 1.4] roughly evenly."""
    emb, labels = batch(b=512, dim=8, per_class=8, seed=6)
    d = distances(emb)
    a, _, n = build_miner("distance_weighted", seed=1)(emb, labels).triplets
    picked = d[a, n].clamp(min=0.5)
    share = torch.histogram(picked, torch.linspace(0.5, 1.4, 10)).hist / len(picked)
    assert (share > 0.04).all() and (share < 0.25).all()


def test_distance_weighted_is_seeded() -> None:
    emb, labels = batch()
    first = build_miner("distance_weighted", seed=7)(emb, labels).triplets
    again = build_miner("distance_weighted", seed=7)(emb, labels).triplets
    other = build_miner("distance_weighted", seed=8)(emb, labels).triplets
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    assert not torch.equal(first[2], other[2])
    pos, _ = label_masks(labels)
    assert len(first[0]) == int(pos.sum())  # one negative per positive pair


# --- PML as an oracle -------------------------------------------------------------------------


def test_pml_batch_hard() -> None:
    miners = pytest.importorskip("pytorch_metric_learning.miners")
    emb, labels = batch()
    ours = triplet_set(build_miner("batch_hard")(emb, labels))
    theirs = set(zip(*(t.tolist() for t in miners.BatchHardMiner()(emb, labels))))
    assert ours == theirs


def test_pml_semihard() -> None:
    """PML's TripletMarginMiner(type_of_triplets="semihard") returns ALL triplets with
    0 < D_an - D_ap <= margin; ours keeps, per (a, p), only the closest such negative (FaceNet).
    So ours must be a subset of PML's, cover exactly the (a, p) PML has, and pick PML's closest."""
    miners = pytest.importorskip("pytorch_metric_learning.miners")
    emb, labels = batch()
    d = distances(emb)
    ours = triplet_set(build_miner("semihard", margin=0.2)(emb, labels))
    theirs = set(zip(*(t.tolist()
                       for t in miners.TripletMarginMiner(margin=0.2, type_of_triplets="semihard")(emb, labels))))
    assert ours and ours <= theirs
    assert {(a, p) for a, p, _ in ours} == {(a, p) for a, p, _ in theirs}
    for a, p, n in ours:
        assert d[a, n] == min(d[a, k] for x, y, k in theirs if (x, y) == (a, p))


def test_pml_multi_similarity() -> None:
    miners = pytest.importorskip("pytorch_metric_learning.miners")
    emb, labels = batch()
    mined = build_miner("ms", epsilon=0.1)(emb, labels)
    a1, p, a2, n = miners.MultiSimilarityMiner(epsilon=0.1)(emb, labels)
    assert set(map(tuple, mined.pos.nonzero().tolist())) == set(zip(a1.tolist(), p.tolist()))
    assert set(map(tuple, mined.neg.nonzero().tolist())) == set(zip(a2.tolist(), n.tolist()))
    assert len(a2) < int(label_masks(labels)[1].sum())  # some negatives were dropped


def test_pml_distance_weighted_probabilities(monkeypatch: pytest.MonkeyPatch) -> None:
    """PML draws with weights exp(-log q(clip(D))) on negatives below 1.4, normalised per anchor;
    capture them and compare with ours (lam = inf: PML does not clip the weights)."""
    pytest.importorskip("pytorch_metric_learning")
    from pytorch_metric_learning.miners import DistanceWeightedMiner, distance_weighted_miner as module

    captured = {}
    real = module.lmu.get_random_triplet_indices

    def capture(labels: torch.Tensor, **kwargs: torch.Tensor) -> tuple:
        captured["weights"] = kwargs["weights"]
        return real(labels, **kwargs)

    monkeypatch.setattr(module.lmu, "get_random_triplet_indices", capture)
    emb, labels = batch(b=64, dim=128, per_class=8)
    DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4)(emb, labels)
    ours = build_miner("distance_weighted").probabilities(emb, labels)
    theirs = torch.nan_to_num(captured["weights"])
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=1e-4)
    assert np.isclose(float(ours.sum()), 64.0)


def test_distance_weighted_as_pairs_for_pair_losses() -> None:
    emb, labels = batch()
    triplets = build_miner("distance_weighted", seed=2)(emb, labels).triplets
    pairs = build_miner("distance_weighted", seed=2, produces="pairs")(emb, labels)
    assert pairs.pos[triplets[0], triplets[1]].all() and pairs.neg[triplets[0], triplets[2]].all()
    assert int(pairs.neg.sum()) == len(set(zip(triplets[0].tolist(), triplets[2].tolist())))
