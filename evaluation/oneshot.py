"""N-way one-shot episodes (Omniglot style) and their error with a 95% confidence interval; numpy only.

Two protocols:

* `within_alphabet` (Lake et al. 2015, the official Omniglot runs): every episode draws its `ways`
  classes from ONE group (alphabet); one drawer's image of each class is the support set and a
  different drawer's image of each class is a query. Groups with fewer than `ways` classes are
  skipped. Without sources (drawers), support and query are any two distinct images of the class.
* `across_alphabets`: the `ways` classes come from anywhere in the set (any group), one random
  support and one other random query image each: easier, since characters of different
  alphabets look less alike.

Each query is classified by its nearest support image (Euclidean distance, i.e. cosine for
L2-normalised embeddings). With `center` c > 0, c times the episode's mean support embedding is first
taken from every support and query embedding of the episode, and they are compared by cosine: this
removes part of what the 20 supports share (the alphabet, the support drawer's hand). It uses the
support set only, never the other queries, so each query is still classified on its own (on Omniglot's
within-alphabet episodes c = 0.5 lowered the cross-validated error by 0.25 points, docs/omniglot.md).
The error is the mean over episodes of the episode's error rate, and
its 95% confidence interval the normal interval of that mean over episodes: it measures how
precisely the episodes estimate the error on this set of images (not the spread across training
seeds or across other alphabets). Episodes depend only on labels, groups, sources and the seed,
so two embeddings of the same images scored with one seed see the same episodes (paired).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from metricsearch.evaluation.distances import as_2d, centred, check_center, sq_distances

PROTOCOLS = ("within_alphabet", "across_alphabets")
Z95 = 1.959963984540054


def _classes_with_two(labels: np.ndarray) -> list[np.ndarray]:
    return [m for m in (np.flatnonzero(labels == c) for c in np.unique(labels)) if len(m) >= 2]


def across_alphabet_episodes(labels: np.ndarray, ways: int, episodes: int, seed: int
                             ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(support indices, query indices), `ways` each, per episode: classes from anywhere in the set."""
    members = _classes_with_two(np.asarray(labels))
    if len(members) < ways:
        raise ValueError(f"{ways}-way one-shot needs {ways} classes with 2+ images, the set has {len(members)}")
    rng = np.random.default_rng(seed)
    for _ in range(episodes):
        classes = rng.choice(len(members), size=ways, replace=False)
        pairs = np.stack([rng.choice(members[c], size=2, replace=False) for c in classes])
        yield pairs[:, 0], pairs[:, 1]


def within_alphabet_episodes(labels: np.ndarray, groups: np.ndarray, sources: np.ndarray | None, ways: int,
                             episodes: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(support indices, query indices), `ways` each, per episode: one group, uniformly among those with
    `ways`+ classes; `ways` of its classes; a support drawer and a different query drawer (sources)."""
    labels, groups = np.asarray(labels), np.asarray(groups)
    sources = np.asarray(sources) if sources is not None else np.arange(len(labels))
    if not len(labels) == len(groups) == len(sources):
        raise ValueError("labels, groups and sources need one entry per image")
    # per group: per class, {source: image indices}; a class needs 2+ sources to give a support and a query
    by_group: dict = {}
    for i, (g, c, s) in enumerate(zip(groups.tolist(), labels.tolist(), sources.tolist())):
        by_group.setdefault(g, {}).setdefault(c, {}).setdefault(s, []).append(i)
    eligible = []
    for g in sorted(by_group, key=str):
        classes = [dict(by_source) for by_source in by_group[g].values() if len(by_source) >= 2]
        if len(classes) >= ways:
            eligible.append(classes)
    if not eligible:
        raise ValueError(f"{ways}-way within-group one-shot needs a group with {ways} classes drawn by 2+ sources; "
                         f"the set has none (largest: {max(len(v) for v in by_group.values())} classes)")
    rng = np.random.default_rng(seed)
    for _ in range(episodes):
        classes = eligible[rng.integers(len(eligible))]
        chosen = [classes[c] for c in rng.choice(len(classes), size=ways, replace=False)]
        drawers = sorted(set.union(*(set(c) for c in chosen)), key=str)
        support_drawer, query_drawer = (drawers[i] for i in rng.choice(len(drawers), size=2, replace=False))
        support, query = [], []
        for by_source in chosen:
            s, q = support_drawer, query_drawer
            if s not in by_source or q not in by_source or s == q:  # this class lacks one of the two drawers
                keys = sorted(by_source, key=str)
                s, q = (keys[i] for i in rng.choice(len(keys), size=2, replace=False))
            support.append(by_source[s][rng.integers(len(by_source[s]))])
            query.append(by_source[q][rng.integers(len(by_source[q]))])
        yield np.array(support), np.array(query)


def episode_errors(
    embeddings: np.ndarray, labels: np.ndarray, groups: np.ndarray | None = None, sources: np.ndarray | None = None,
    ways: int = 20, protocol: str = "within_alphabet", episodes: int = 1000, seed: int = 0, center: float = 0.0,
) -> np.ndarray:
    """The error rate of each episode (queries not nearest to their own class's support image)."""
    x = as_2d(embeddings, "one-shot")
    check_center(center)
    if protocol == "within_alphabet":
        if groups is None:
            raise ValueError("the within_alphabet protocol needs each image's group (alphabet); this set has none")
        episodes_iter = within_alphabet_episodes(labels, groups, sources, ways, episodes, seed)
    elif protocol == "across_alphabets":
        episodes_iter = across_alphabet_episodes(labels, ways, episodes, seed)
    else:
        raise ValueError(f"unknown one-shot protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
    errors = np.empty(episodes)
    for e, (support, query) in enumerate(episodes_iter):
        d = sq_distances(*centred(x[query], x[support], center))
        errors[e] = np.mean(d.argmin(axis=1) != np.arange(len(query)))
    return errors


def mean_ci(values: np.ndarray, clip: tuple[float, float] | None = (0.0, 1.0)) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its normal 95% confidence interval, clipped to `clip` (error rates
    lie in [0, 1]; pass None for paired differences)."""
    v = np.asarray(values, dtype=np.float64)
    mean = float(v.mean())
    half = Z95 * float(v.std(ddof=1)) / np.sqrt(len(v)) if len(v) > 1 else float("inf")
    low, high = mean - half, mean + half
    return (mean, max(clip[0], low), min(clip[1], high)) if clip else (mean, low, high)


def one_shot_error(
    embeddings: np.ndarray, labels: np.ndarray, groups: np.ndarray | None = None, sources: np.ndarray | None = None,
    ways: int = 20, protocol: str = "within_alphabet", episodes: int = 1000, seed: int = 0, center: float = 0.0,
) -> tuple[float, float, float]:
    """(error, ci_low, ci_high) of N-way one-shot classification over `episodes` episodes of `protocol`."""
    return mean_ci(episode_errors(embeddings, labels, groups, sources, ways, protocol, episodes, seed, center))


def one_shot_accuracy(
    embeddings: np.ndarray, labels: np.ndarray, ways: int = 20, episodes: int = 1000, seed: int = 0,
) -> float:
    """N-way one-shot accuracy over across-alphabet episodes: per episode, `ways` classes with one support
    image each; every class also gives one other image as a query, which must be nearest to its own
    class's support image."""
    return 1.0 - float(episode_errors(embeddings, labels, None, None, ways, "across_alphabets", episodes, seed).mean())
