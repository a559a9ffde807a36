"""Retrieval metrics against direct, slow references of their definitions."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import normalized_mutual_info_score

from metricsearch.evaluation import evaluate, nmi, one_shot_accuracy, retrieval_metrics
from metricsearch.evaluation.metrics import nmi_score


def slow_metrics(q, ql, g, gl, ks, same_set):
    """Recall@K and MAP@R by a Python loop over queries, with a full sort."""
    hits = {k: 0 for k in ks}
    ap_sum, n = 0.0, 0
    for i in range(len(q)):
        d = ((g - q[i]) ** 2).sum(1)
        order = [j for j in np.argsort(d, kind="stable") if not (same_set and j == i)]
        rel = [gl[j] == ql[i] for j in order]
        r = sum(rel)
        if r == 0:
            continue
        n += 1
        for k in ks:
            hits[k] += any(rel[:k])
        precisions = [sum(rel[: p + 1]) / (p + 1) for p in range(r) if rel[p]]
        ap_sum += sum(precisions) / r
    return {k: hits[k] / n for k in ks}, ap_sum / n, n


@pytest.mark.parametrize("same_set", [True, False])
def test_recall_and_map_at_r_match_the_definition(same_set: bool) -> None:
    rng = np.random.default_rng(0)
    q = rng.normal(size=(70, 5)).astype(np.float32)
    ql = rng.integers(0, 6, size=70)
    g, gl = (q, ql) if same_set else (rng.normal(size=(90, 5)).astype(np.float32), rng.integers(0, 7, size=90))
    ks = (1, 2, 4, 8)
    got = retrieval_metrics(q, ql, None if same_set else g, None if same_set else gl, ks, block_size=16)
    recall, map_at_r, n = slow_metrics(q, ql, g, gl, ks, same_set)
    assert got["n_queries"] == n
    assert got["recall_at_k"] == pytest.approx(recall)
    assert got["map_at_r"] == pytest.approx(map_at_r)


def test_nmi_score_equals_scikit_learns() -> None:
    rng = np.random.default_rng(1)
    for _ in range(5):
        a, b = rng.integers(0, 5, 200), rng.integers(0, 8, 200)
        assert nmi_score(a, b) == pytest.approx(normalized_mutual_info_score(a, b, average_method="geometric"))


def test_nmi_of_separated_clusters_is_one_and_evaluate_has_the_keys() -> None:
    rng = np.random.default_rng(2)
    centres = rng.normal(size=(4, 8)) * 10
    labels = np.repeat(np.arange(4), 25)
    x = (centres[labels] + rng.normal(size=(100, 8)) * 0.1).astype(np.float32)
    assert nmi(x, labels) == pytest.approx(1.0)
    result = evaluate(x, labels, recall_k=(1, 4), one_shot_ways=4)
    assert set(result) == {"recall_at_k", "nmi", "map_at_r", "n_queries", "one_shot_4way"}
    assert result["recall_at_k"] == {1: 1.0, 4: 1.0} and result["one_shot_4way"] == 1.0


def test_one_shot_accuracy_is_chance_on_noise() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, 16)).astype(np.float32)
    labels = np.repeat(np.arange(40), 10)
    assert abs(one_shot_accuracy(x, labels, ways=5, episodes=400) - 0.2) < 0.05


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="2-D"):
        retrieval_metrics(np.zeros(5), np.zeros(5))
    with pytest.raises(ValueError, match="one label"):
        retrieval_metrics(np.zeros((5, 2)), np.zeros(4))


def test_per_average_precision_at_r_averages_to_map_at_r() -> None:
    from metricsearch.evaluation.distances import sq_distances
    from metricsearch.evaluation.metrics import average_precision_at_r, nearest, retrieval_metrics

    rng = np.random.default_rng(3)
    q, g = rng.normal(size=(40, 8)).astype(np.float32), rng.normal(size=(90, 8)).astype(np.float32)
    ql, gl = rng.integers(0, 5, 40), rng.integers(0, 5, 90)
    r = (gl[None, :] == ql[:, None]).sum(1)
    ap = average_precision_at_r(gl[nearest(sq_distances(q, g), int(r.max()))] == ql[:, None], r)
    assert ap.shape == (40,) and len(set(np.round(ap, 6))) > 5
    assert ap.mean() == pytest.approx(retrieval_metrics(q, ql, g, gl, (1,))["map_at_r"], abs=1e-12)
