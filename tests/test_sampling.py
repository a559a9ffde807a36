"""Batch samplers, importance weights and start-up compatibility checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from metricsearch.train import losses
from metricsearch.train.losses.base import PairLoss
from metricsearch.train.components import check_compatible
from metricsearch.train.miners import build_miner
from metricsearch.train.samplers import SAMPLERS, build_sampler
from metricsearch.train.samplers.base import Design, LabelBatchSampler
from metricsearch.train.samplers.group import q_group
from metricsearch.train.samplers.p_random import q_p_random
from metricsearch.train.weightings import build_weighting

COUNTS = [2, 3, 5, 8]  # small unbalanced training set: 4 classes, 18 images
LABELS = np.repeat(np.arange(len(COUNTS)), COUNTS)
N = len(LABELS)


def shuffled_labels(seed: int = 0) -> np.ndarray:
    """The unbalanced labels in a random order (samplers must not assume sorted labels)."""
    return np.random.default_rng(seed).permutation(LABELS)


def class_pair_q(q: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """N x N Q of every ordered image pair (i != j) from the C x C class-pair table."""
    full = q[labels[:, None], labels[None, :]]
    np.fill_diagonal(full, 0.0)
    return full


def test_q_tables_are_the_papers_eqs_8_and_9() -> None:
    counts = np.array(COUNTS, dtype=float)
    big_l, m, n, p = len(COUNTS), 2, 3, 0.3
    c, d = 3, 1
    assert q_group(counts, m, n)[c, c] == pytest.approx((m - 1) / (big_l * (m * n - 1) * counts[c] * (counts[c] - 1)))
    assert q_group(counts, m, n)[c, d] == pytest.approx(
        m * (n - 1) / (big_l * (big_l - 1) * (m * n - 1) * counts[c] * counts[d])
    )
    assert q_p_random(counts, p)[c, c] == pytest.approx(p / (big_l * counts[c] * (counts[c] - 1)))
    assert q_p_random(counts, p)[c, d] == pytest.approx((1 - p) / (big_l * (big_l - 1) * counts[c] * counts[d]))
    # both are distributions over the N(N-1) ordered pairs
    assert class_pair_q(q_group(counts, m, n), LABELS).sum() == pytest.approx(1.0)
    assert class_pair_q(q_p_random(counts, p), LABELS).sum() == pytest.approx(1.0)


def assert_frequencies_match(hits: np.ndarray, trials: int, q: np.ndarray) -> None:
    """Each ordered pair's hit count is Binomial(trials, q): allow 5 standard errors (+1 count).

    With 306 ordered pairs, a 5-sigma deviation of any one of them has probability < 1e-4
    under the null (normal approximation), so the test is not flaky, while a Q that is wrong by a
    few per cent is detected for the frequent pairs (their relative standard error is ~1%).
    """
    expected = trials * q
    sigma = np.sqrt(trials * q * (1 - q))
    off = np.abs(hits - expected) > 5 * sigma + 1
    assert not off.any(), f"pairs {np.argwhere(off)[:5]} hit {hits[off][:5]} times, expected {expected[off][:5]}"


def test_group_pair_frequencies_match_eq_9() -> None:
    labels = shuffled_labels()
    m, n, draws = 2, 2, 20_000
    sampler = build_sampler("group", labels, classes_per_batch=n, images_per_class=m)
    rng = np.random.default_rng(1)
    hits = np.zeros((N, N))
    for _ in range(draws):
        batch = sampler.draw(rng)
        hits[batch[:, None], batch[None, :]] += 1  # all ordered pairs of the batch
    np.fill_diagonal(hits, 0)
    # trials: pair slots = draws x m n (m n - 1); Q is the probability per slot
    slots = m * n * (m * n - 1)
    q = class_pair_q(q_group(np.array(COUNTS), m, n), labels)
    assert_frequencies_match(hits, draws * slots, q)


def test_p_random_pair_frequencies_match_eq_8() -> None:
    labels = shuffled_labels()
    p, k, draws = 0.3, 16, 5_000
    sampler = build_sampler("p_random", labels, p=p, pairs_per_batch=k)
    rng = np.random.default_rng(2)
    hits = np.zeros((N, N))
    for _ in range(draws):
        batch = sampler.draw(rng).reshape(-1, 2)
        np.add.at(hits, (batch[:, 0], batch[:, 1]), 1)  # the ordered pair (a_k, b_k) as drawn
    assert np.diag(hits).sum() == 0
    q = class_pair_q(q_p_random(np.array(COUNTS), p), labels)
    assert_frequencies_match(hits, draws * k, q)


def test_p_random_pairs_layout_and_masks() -> None:
    labels = shuffled_labels()
    sampler = build_sampler("p_random", labels, p=0.5, pairs_per_batch=8)
    batch = np.array(next(iter(sampler)))
    assert len(batch) == sampler.batch_size == 16
    mined = sampler.pairs(torch.as_tensor(labels[batch]))
    designated = torch.zeros(16, 16, dtype=torch.bool)
    idx = torch.arange(0, 16, 2)
    designated[idx, idx + 1] = designated[idx + 1, idx] = True
    assert torch.equal(mined.pos | mined.neg, designated)
    assert not (mined.pos & mined.neg).any()
    same = torch.as_tensor(labels[batch][:, None] == labels[batch][None, :])
    assert torch.equal(mined.pos, designated & same)
    pairs = batch.reshape(-1, 2)
    assert (pairs[:, 0] != pairs[:, 1]).all()


def contrastive_loss() -> PairLoss:
    """The registered contrastive loss (a pair loss that takes a weighting)."""
    return losses.build("contrastive", margin=1.0)


def full_data_loss(loss: PairLoss, emb: torch.Tensor, labels: torch.Tensor) -> float:
    """Eq. 10 scaled by 1/(N(N-1)): the mean per-pair loss over all ordered pairs i != j."""
    n = len(labels)
    total = loss(emb, labels,
                 weighting=lambda pair_losses, p, q, y: torch.where(p | q, pair_losses, 0.0).sum() / (n * (n - 1)))
    return float(total)


@pytest.mark.parametrize(
    "name, params, draws",
    [
        ("group", {"classes_per_batch": 2, "images_per_class": 2}, 20_000),  # eq. 25 exactly
        ("group", {"classes_per_batch": 2, "images_per_class": 4}, 20_000),  # small-class rule
        ("p_random", {"p": 0.8, "pairs_per_batch": 8}, 20_000),  # eq. 24
    ],
)
def test_importance_weighted_loss_is_unbiased(name: str, params: dict, draws: int) -> None:
    labels_np = shuffled_labels(3)
    labels = torch.as_tensor(labels_np)
    emb = torch.nn.functional.normalize(torch.randn(N, 8, generator=torch.Generator().manual_seed(0)), dim=1)
    loss = contrastive_loss()
    target = full_data_loss(loss, emb, labels)
    sampler = build_sampler(name, labels_np, **params)
    counts = {int(c): int(k) for c, k in zip(*np.unique(labels_np, return_counts=True))}
    weighting = build_weighting("importance", context={"class_counts": counts, "sampler": sampler})
    rng = np.random.default_rng(4)
    weighted, plain = [], []
    for _ in range(draws):
        batch = torch.as_tensor(sampler.draw(rng))
        mined = sampler.pairs(labels[batch])
        weighted.append(float(loss(emb[batch], labels[batch], mined, weighting=weighting)))
        plain.append(float(loss(emb[batch], labels[batch], mined)))
    assert np.mean(weighted) == pytest.approx(target, rel=0.02)
    assert abs(np.mean(plain) / target - 1) > 0.1  # the skewed designs are biased without weights


def test_importance_delta_and_errors() -> None:
    sampler = build_sampler("group", LABELS, classes_per_batch=2, images_per_class=2)
    w1 = build_weighting("importance", context={"sampler": sampler})
    w2 = build_weighting("importance", context={"sampler": sampler}, delta=0.5)
    w0 = build_weighting("importance", context={"sampler": sampler}, delta=0.0)
    y = torch.as_tensor(LABELS)
    assert torch.allclose(w2.importance_weights(y), w1.importance_weights(y).sqrt())
    assert torch.equal(w0.importance_weights(y), torch.ones(N, N))
    hard = build_sampler("npair_hard_class", LABELS, classes_per_batch=2)
    with pytest.raises(ValueError, match="group.*p_random"):
        build_weighting("importance", context={"sampler": hard})
    with pytest.raises(ValueError, match="class_counts"):
        build_weighting("importance", context={"sampler": sampler, "class_counts": {0: 2, 1: 3, 2: 5, 3: 9}})


@pytest.mark.parametrize(
    "name, params",
    [
        ("group", {"classes_per_batch": 2, "images_per_class": 2}),
        ("p_random", {"p": 0.5, "pairs_per_batch": 3}),
        ("npair_hard_class", {"classes_per_batch": 2, "images_per_class": 2}),
        ("super_class", {"classes_per_batch": 2, "images_per_class": 2, "groups": np.arange(N) % 2}),
    ],
)
def test_samplers_deterministic_epochs_ranks(name: str, params: dict) -> None:
    labels = shuffled_labels()

    def epoch(seed: int, ep: int, rank: int = 0, world: int = 1, batches: int = 6) -> list[list[int]]:
        s = build_sampler(name, labels, seed=seed, rank=rank, world_size=world, batches_per_epoch=batches, **params)
        s.set_epoch(ep)
        return list(s)

    assert epoch(0, 0) == epoch(0, 0)
    assert epoch(0, 0) != epoch(0, 1)
    assert epoch(0, 0) != epoch(1, 0)
    whole = epoch(0, 2, batches=6)
    r0, r1 = epoch(0, 2, 0, 2, batches=3), epoch(0, 2, 1, 2, batches=3)
    assert r0 == whole[0::2] and r1 == whole[1::2]  # the ranks split one stream, no batch shared
    for batch in whole:
        assert all(0 <= i < N for i in batch)
        assert len(batch) == len(set(batch)) or name == "p_random"  # p_random may repeat an image


def test_all_samplers_are_covered() -> None:
    assert set(SAMPLERS.names()) >= {"group", "p_random", "npair_hard_class", "super_class"}


#: 20 classes of 3 images in 4 super-classes of 2, 4, 6 and 8 classes
SUPER_SIZES = [2, 4, 6, 8]
SUPER_OF_CLASS = np.repeat(np.arange(len(SUPER_SIZES)), SUPER_SIZES)
SUPER_LABELS = np.random.default_rng(1).permutation(np.repeat(np.arange(len(SUPER_OF_CLASS)), 3))


@pytest.mark.parametrize("n, s, groups_per_batch", [(2, 1, {1}), (7, 1, {1, 2, 3}), (9, 2, {2, 3}), (20, 1, {4})])
def test_super_class_batches_come_from_as_few_super_classes_as_hold_them(n, s, groups_per_batch) -> None:
    sampler = build_sampler("super_class", SUPER_LABELS, SUPER_OF_CLASS[SUPER_LABELS], classes_per_batch=n,
                            images_per_class=2, super_classes_per_batch=s)
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(300):
        batch = sampler.draw(rng)
        classes, per_class = np.unique(SUPER_LABELS[batch], return_counts=True)
        assert len(batch) == len(set(batch.tolist())) == 2 * n and len(classes) == n and (per_class == 2).all()
        groups = np.unique(SUPER_OF_CLASS[classes])
        sizes = sorted(SUPER_SIZES[g] for g in groups)
        assert sum(sizes) >= n and len(groups) >= s
        assert len(groups) == s or sum(sizes) - sizes[-1] < n  # taken until they held n: without the last, short
        seen.add(len(groups))
    assert seen == groups_per_batch


def test_super_class_batches_draw_every_class_equally_often() -> None:
    sampler = build_sampler("super_class", SUPER_LABELS, SUPER_OF_CLASS[SUPER_LABELS], classes_per_batch=2,
                            images_per_class=2)
    rng = np.random.default_rng(0)
    draws = 20_000
    hits = np.bincount(np.concatenate([np.unique(SUPER_LABELS[sampler.draw(rng)]) for _ in range(draws)]), minlength=20)
    expected = draws * 2 / 20  # a super-class as often as its classes, then 2 of its classes: 2/20 per class
    assert np.abs(hits - expected).max() < 5 * np.sqrt(expected * (1 - 2 / 20))


def test_super_class_sampler_takes_images_without_a_group_as_one_more_group() -> None:
    names = np.array([None, "latin", "greek", None], dtype=object)[SUPER_OF_CLASS[SUPER_LABELS]]
    sampler = build_sampler("super_class", SUPER_LABELS, names, classes_per_batch=2, images_per_class=2)
    same = build_sampler("super_class", SUPER_LABELS, SUPER_OF_CLASS[SUPER_LABELS] % 3, classes_per_batch=2,
                         images_per_class=2)
    assert sorted(sampler.sizes.tolist()) == sorted(same.sizes.tolist()) == [4, 6, 10]


def test_super_class_sampler_rejects_missing_groups_and_bad_counts() -> None:
    with pytest.raises(ValueError, match="needs the group of each image.*use sampler group"):
        build_sampler("super_class", SUPER_LABELS, classes_per_batch=2, images_per_class=2)
    with pytest.raises(ValueError, match="between 1 and the 4 super-classes, got 5"):
        build_sampler("super_class", SUPER_LABELS, SUPER_OF_CLASS[SUPER_LABELS], classes_per_batch=2,
                      images_per_class=2, super_classes_per_batch=5)


class UniformSampler(LabelBatchSampler):
    """6 distinct images uniformly at random: every ordered pair is equally likely, so W = 1."""

    batch_size = 6

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        return rng.choice(len(self.labels), size=self.batch_size, replace=False)

    def design(self, counts: np.ndarray) -> Design:
        total = counts.sum()
        return Design(np.full((len(counts), len(counts)), 1.0 / (total * (total - 1))), 6 * 5)


def test_samplers_describe_their_pair_design() -> None:
    counts = np.array(COUNTS)
    group = build_sampler("group", LABELS, classes_per_batch=2, images_per_class=3)
    np.testing.assert_array_equal(group.design(counts).q, q_group(counts, 3, 2))
    assert group.design(counts).slots == 6 * 5 and not group.fixes_pairs
    prand = build_sampler("p_random", LABELS, p=0.3, pairs_per_batch=4)
    np.testing.assert_array_equal(prand.design(counts).q, q_p_random(counts, 0.3))
    assert prand.design(counts).slots == 8 and prand.fixes_pairs
    hard = build_sampler("npair_hard_class", LABELS, classes_per_batch=2)
    assert hard.design(counts) is None and not hard.fixes_pairs
    assert group.pairs(torch.as_tensor(LABELS)) is None and hard.pairs(torch.as_tensor(LABELS)) is None


def test_importance_weights_follow_any_sampler_that_describes_its_design() -> None:
    uniform = UniformSampler(LABELS)
    weighting = build_weighting("importance", context={"sampler": uniform})
    check_compatible(contrastive_loss(), None, weighting, uniform)
    torch.testing.assert_close(weighting.importance_weights(torch.as_tensor(LABELS)), torch.ones(N, N))


def test_hard_class_mining_picks_the_closest_classes() -> None:
    labels = np.repeat(np.arange(8), 4)
    sampler = build_sampler("npair_hard_class", labels, classes_per_batch=4, images_per_class=2)
    # class means: classes 0-3 around one direction, 4-7 around an orthogonal one
    gen = torch.Generator().manual_seed(0)
    centre = torch.eye(16)[torch.as_tensor(labels >= 4).long()] * 5
    emb = centre + 0.3 * torch.randn(len(labels), 16, generator=gen)
    rng = np.random.default_rng(0)
    before = {frozenset(labels[sampler.draw(rng)] >= 4) for _ in range(30)}
    assert frozenset({False, True}) in before  # random classes before any embedding: mixed clusters
    sampler.observe(list(range(len(labels))), emb)
    for _ in range(20):
        batch = sampler.draw(rng)
        assert len(set(labels[batch] >= 4)) == 1  # all four classes from the seed's cluster
        assert len(set(labels[batch])) == 4


def test_hard_class_refresh_waits() -> None:
    labels = np.repeat(np.arange(4), 3)
    sampler = build_sampler("npair_hard_class", labels, classes_per_batch=2, refresh=2)
    sampler.observe([0, 1, 3, 4], torch.randn(4, 8))
    assert not sampler.seen.any()
    sampler.observe([6, 7], torch.randn(2, 8))
    assert sampler.seen.tolist() == [True, True, True, False]


class _Triplet(PairLoss):
    """A stand-in loss that mines triplets and takes no weighting."""

    mines = "triplets"
    accepts_weighting = False


class _NoMining(PairLoss):
    """A stand-in loss that ignores mined input."""

    mines = "none"


def test_check_compatible() -> None:
    pair_loss, triplet_loss = contrastive_loss(), _Triplet()
    group = build_sampler("group", LABELS, classes_per_batch=2, images_per_class=2)
    prand = build_sampler("p_random", LABELS)
    importance = build_weighting("importance", context={"sampler": group})
    check_compatible(pair_loss, build_miner("ms"), importance, group)
    check_compatible(triplet_loss, build_miner("semihard"), None, group)
    check_compatible(pair_loss, build_miner("distance_weighted", produces="pairs"), None, group)
    check_compatible(pair_loss, None, build_weighting("dro_topk", k=10), prand)
    with pytest.raises(ValueError, match="triplets but loss"):
        check_compatible(pair_loss, build_miner("batch_hard"), None, group)
    with pytest.raises(ValueError, match="pairs but loss"):
        check_compatible(triplet_loss, build_miner("ms"), None, group)
    with pytest.raises(ValueError, match="weighting"):
        check_compatible(triplet_loss, None, build_weighting("dro_kl"), group)
    with pytest.raises(ValueError, match="fixes the pairs"):
        check_compatible(triplet_loss, None, None, prand)
    with pytest.raises(ValueError, match="fixes the pairs"):
        check_compatible(_NoMining(), None, None, prand)
    with pytest.raises(ValueError, match="ignores mined"):
        check_compatible(_NoMining(), build_miner("ms"), None, group)
    with pytest.raises(ValueError, match="another sampler"):
        check_compatible(pair_loss, None, importance, prand)
