"""Gallery expansion (`evaluation.expansion`): against a loop reference of its rule, on a synthetic domain shift
(gallery entries offset from the photos of their class, as studio images are from shelf photos), and its edges."""

from __future__ import annotations

import numpy as np
import pytest

from metricsearch.evaluation.distances import normalized
from metricsearch.evaluation.expansion import expand_gallery


def reference(gallery: np.ndarray, pool: np.ndarray, rounds: int) -> np.ndarray:
    """The rule written out entry by entry: anchor + mean of the pool images nearest it, until nothing moves."""
    anchors, pool = normalized(gallery), normalized(pool)
    entries, owner = anchors.copy(), None
    for _ in range(rounds):
        nearest = [int(np.argmax([float(p @ e) for e in entries])) for p in pool]
        if nearest == owner:
            break
        owner = nearest
        for j in range(len(anchors)):
            mine = [p for p, o in zip(pool, owner) if o == j]
            moved = anchors[j] + (np.mean(mine, axis=0) if mine else 0.0)
            entries[j] = moved / np.linalg.norm(moved)
    return entries


def shifted(classes: int = 30, per_class: int = 12, dim: int = 24, shift: float = 1.2, seed: int = 0):
    """Gallery: one entry per class, its centre plus a shift shared by all entries (the studio look) and its own
    offset; pool and queries: photos around the centres."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim))
    common = shift * rng.normal(size=dim)
    gallery = centres + common + 0.9 * rng.normal(size=(classes, dim))
    labels = np.repeat(np.arange(classes), per_class)
    pool = centres[labels] + 0.8 * rng.normal(size=(len(labels), dim))
    queries = centres[labels] + 0.8 * rng.normal(size=(len(labels), dim))
    return gallery.astype(np.float32), pool.astype(np.float32), queries.astype(np.float32), labels


def test_expansion_follows_its_rule_and_runs_until_the_assignment_settles() -> None:
    gallery, pool, _, _ = shifted()
    for rounds in (1, 2, 10):
        np.testing.assert_allclose(expand_gallery(gallery, pool, rounds), reference(gallery, pool, rounds), atol=1e-5)
    assert not np.allclose(expand_gallery(gallery, pool, 1), expand_gallery(gallery, pool, 10), atol=1e-4)


def test_expansion_brings_shifted_entries_to_their_photos() -> None:
    gallery, pool, queries, labels = shifted()
    q = normalized(queries)
    before = (np.argmax(q @ normalized(gallery).T, 1) == labels).mean()
    after = (np.argmax(q @ expand_gallery(gallery, pool).T, 1) == labels).mean()
    assert before < 0.9 and after > before + 0.1


def test_entries_no_pool_image_chooses_stay_where_they_are_and_all_are_unit_length() -> None:
    gallery, pool, _, _ = shifted()
    gallery, pool = (np.hstack([x, np.full((len(x), 1), 9.0, np.float32)]) for x in (gallery, pool))
    far = np.zeros((1, gallery.shape[1]), np.float32)
    far[0, -1] = -1.0  # faces away from every pool image: none has it nearest
    assert ((normalized(pool) @ far.T) < (normalized(pool) @ normalized(gallery).T).max(1, keepdims=True)).all()
    out = expand_gallery(np.vstack([gallery, far]), pool)
    np.testing.assert_allclose(out[-1], far[0], atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("pool, rounds, message", [
    (np.zeros((3, 5), np.float32), 10, "embed both with the same model"),
    (np.ones((3, 4), np.float32), 0, "rounds must be 1 or more"),
])
def test_bad_input_is_refused_with_a_clear_message(pool, rounds, message) -> None:
    with pytest.raises(ValueError, match=message):
        expand_gallery(np.ones((2, 4), np.float32), pool, rounds)
