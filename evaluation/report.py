"""`evaluate --report DIR`: where a model fails, as files: worst.png (the worst queries and their neighbours),
classes.csv + classes.png (per-class Recall@1 and MAP@R, worst first), confusions.csv (the most confused
label pairs), map.png (a t-SNE map of the embeddings) and report.html tying them together, readable offline.

Neighbours are exact (Euclidean, as the metrics rank). matplotlib and scikit-learn (the `report` extra)
are imported only here, so serving never needs them.
"""

from __future__ import annotations

import csv
import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import faiss
import numpy as np
from PIL import Image, ImageOps

from metricsearch.evaluation.metrics import average_precision_at_r
from metricsearch.evaluation.thumbnails import BLUE, GREEN, GREY, RED, Tile, grid_image

MAX_RANKED = 1000  # neighbours ranked per query: MAP@R of larger classes counts only these
MAP_POINTS = 5000  # points of the t-SNE map at most (a random sample above)


@dataclass(frozen=True)
class ReportSet:
    """Embeddings of some images, their label codes (-1: none) and a loader of image i."""

    vectors: np.ndarray
    labels: np.ndarray
    load: Callable[[int], Image.Image]


@dataclass(frozen=True)
class Ranking:
    """Each labelled query's ranked neighbours and scores: first correct rank (ranked + 1 if none), AP@R, R@1."""

    rows: np.ndarray
    neighbours: np.ndarray
    first: np.ndarray
    ap: np.ndarray
    hit1: np.ndarray


def rank(query: ReportSet, gallery: ReportSet | None = None, k: int = 8) -> Ranking:
    """Exact neighbours of every labelled query in the gallery (the queries themselves, each left out, when None)."""
    same = gallery is None
    g = query if same else gallery
    ql, gl = np.asarray(query.labels), np.asarray(g.labels)
    classes, counts = np.unique(gl[gl >= 0], return_counts=True)
    pos = np.clip(np.searchsorted(classes, ql), 0, max(len(classes) - 1, 0))
    r = np.where((ql >= 0) & (classes[pos] == ql), counts[pos], 0) - int(same) if len(classes) else np.zeros(len(ql))
    rows = np.flatnonzero(r > 0)
    if not len(rows):
        raise ValueError("the report needs queries whose label other images share")
    n_top = int(min(len(g.vectors) - int(same), max(k, int(r.max())), MAX_RANKED))
    q = np.ascontiguousarray(np.asarray(query.vectors, np.float32)[rows])
    _, idx = faiss.knn(q, np.ascontiguousarray(np.asarray(g.vectors, np.float32)), n_top + int(same))
    if same:
        keep = idx != rows[:, None]
        keep[keep.all(axis=1), -1] = False
        idx = idx[keep].reshape(len(rows), n_top)
    relevant = gl[idx] == ql[rows, None]
    first = np.where(relevant.any(axis=1), relevant.argmax(axis=1) + 1, n_top + 1)
    return Ranking(rows, idx, first, average_precision_at_r(relevant, r[rows]), relevant[:, 0])


def class_table(ranking: Ranking, query_labels: np.ndarray, gallery_labels: np.ndarray,
                names: Sequence[str]) -> tuple[list[dict], list[dict]]:
    """(per-class rows: label, queries, recall_at_1, map_at_r, most_confused_with; worst Recall@1 first,
    then worst MAP@R) and (label pairs: label_a, label_b, count, confused top-1 either way; most first)."""
    ql = np.asarray(query_labels)[ranking.rows]
    top = np.asarray(gallery_labels)[ranking.neighbours[:, 0]]
    n = np.bincount(ql, minlength=len(names))
    present = np.flatnonzero(n)
    recall = np.bincount(ql, weights=ranking.hit1, minlength=len(names))[present] / n[present]
    mapr = np.bincount(ql, weights=ranking.ap, minlength=len(names))[present] / n[present]
    wrong = ~ranking.hit1
    directed, directed_n = np.unique(np.stack([ql[wrong], top[wrong]], axis=1).reshape(-1, 2), axis=0,
                                     return_counts=True)
    confused_with: dict[int, tuple[int, int]] = {}
    for (a, b), c in zip(directed.tolist(), directed_n.tolist()):
        if c > confused_with.get(a, (-1, 0))[1]:
            confused_with[a] = (b, c)
    classes = [{"label": names[c], "queries": int(n[c]), "recall_at_1": round(float(rc), 4),
                "map_at_r": round(float(m), 4),
                "most_confused_with": names[confused_with[c][0]] if c in confused_with else ""}
               for c, rc, m in zip(present.tolist(), recall, mapr)]
    classes.sort(key=lambda row: (row["recall_at_1"], row["map_at_r"]))
    pairs, inverse = np.unique(np.sort(directed, axis=1), axis=0, return_inverse=True)
    counts = np.bincount(inverse.reshape(-1), weights=directed_n, minlength=len(pairs)).astype(int)
    confusions = [{"label_a": names[pairs[i, 0]], "label_b": names[pairs[i, 1]], "count": int(counts[i])}
                  for i in np.argsort(-counts, kind="stable").tolist()]
    return classes, confusions


def _short(label: str, most: int = 13) -> str:
    """A label cut to its last characters (where Omniglot's and folder labels differ) to fit a caption."""
    return label if len(label) <= most else ".." + label[-(most - 2):]


def worst_queries(ranking: Ranking, query: ReportSet, gallery: ReportSet, names: Sequence[str], k: int = 8,
                  count: int = 12) -> Image.Image:
    """Rows of the `count` queries whose first correct hit ranks lowest (then lowest AP@R): the query (blue),
    its top-k (wrong label red, the first correct green, other correct grey), and the first correct hit
    after them when it ranks below k."""
    order = np.lexsort((ranking.ap, -ranking.first))[:count]
    rows, titles = [], []
    for j in order.tolist():
        qi, first = int(ranking.rows[j]), int(ranking.first[j])
        qlabel = int(query.labels[qi])
        tiles = [Tile(query.load(qi), "query", BLUE)]
        for rank_, gi in enumerate(ranking.neighbours[j, :k].tolist(), start=1):
            glabel = int(gallery.labels[gi])
            colour = GREEN if rank_ == first else GREY if glabel == qlabel else RED
            tiles.append(Tile(gallery.load(gi), f"#{rank_} {_short(names[glabel]) if glabel >= 0 else '-'}", colour))
        if k < first <= ranking.neighbours.shape[1]:
            gi = int(ranking.neighbours[j, first - 1])
            tiles.append(Tile(gallery.load(gi), f"#{first} {_short(names[qlabel])}", GREEN))
        rows.append(tiles)
        titles.append(f"{names[qlabel]}: first correct at rank "
                      f"{first if first <= ranking.neighbours.shape[1] else '>' + str(first - 1)}")
    return grid_image(rows, row_titles=titles)


def class_chart(classes: list[dict], path: Path, most: int = 30) -> None:
    """Horizontal bars of Recall@1 and MAP@R of the `most` worst classes, worst at the top."""
    from matplotlib.figure import Figure

    shown = classes[:most]
    y = np.arange(len(shown))
    fig = Figure(figsize=(7, 1.2 + 0.28 * len(shown)))
    ax = fig.add_subplot()
    ax.barh(y - 0.2, [c["recall_at_1"] for c in shown], 0.4, label="Recall@1", color="#d9534f")
    ax.barh(y + 0.2, [c["map_at_r"] for c in shown], 0.4, label="MAP@R", color="#5b8fd9")
    ax.set_yticks(y, [c["label"][-28:] for c in shown], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_title(f"worst {len(shown)} of {len(classes)} classes")
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def embedding_map(sets: Sequence[ReportSet], path: Path, max_points: int = MAP_POINTS, thumbnails: int = 12,
                  seed: int = 0) -> int:
    """t-SNE of the sets' embeddings (a random sample of at most `max_points`) coloured by label, with a few
    thumbnails placed at their points; returns the number of points drawn."""
    from matplotlib.figure import Figure
    from matplotlib.offsetbox import AnnotationBbox, OffsetImage
    from sklearn.manifold import TSNE

    which = np.concatenate([np.full(len(s.labels), i) for i, s in enumerate(sets)])
    index = np.concatenate([np.arange(len(s.labels)) for s in sets])
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(len(which), size=min(max_points, len(which)), replace=False))
    x = np.concatenate([np.asarray(s.vectors, np.float32) for s in sets])[pick]
    labels = np.concatenate([np.asarray(s.labels) for s in sets])[pick]
    xy = TSNE(n_components=2, init="pca", perplexity=float(min(30.0, max(2.0, (len(x) - 1) / 3))),
              random_state=seed).fit_transform(x)
    fig = Figure(figsize=(8, 8))
    ax = fig.add_subplot()
    ax.scatter(xy[:, 0], xy[:, 1], c=labels % 20, cmap="tab20", s=6, linewidths=0)
    for p in rng.choice(len(pick), size=min(thumbnails, len(pick)), replace=False).tolist():
        image = ImageOps.contain(sets[which[pick[p]]].load(int(index[pick[p]])).convert("RGB"), (40, 40))
        ax.add_artist(AnnotationBbox(OffsetImage(np.asarray(image)), tuple(xy[p]), frameon=True, pad=0.1))
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"t-SNE of {len(pick)} embeddings, coloured by label")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return len(pick)


def _write_csv(path: Path, rows: list[dict], fields: Sequence[str]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields))
        writer.writeheader()
        writer.writerows(rows)


def _table(rows: list[dict], fields: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(f)}</th>" for f in fields)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r[f]))}</td>" for f in fields) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _html(metrics: dict[str, Any], classes: list[dict], confusions: list[dict], points: int) -> str:
    style = ("body{font-family:sans-serif;margin:2em;max-width:75em}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}img{max-width:100%}")
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>metricsearch evaluation report</title><style>{style}</style></head>
<body><h1>Where the model fails</h1>
<h2>Metrics</h2><pre>{html.escape(json.dumps(metrics, indent=2))}</pre>
<h2>Worst queries</h2>
<p>Each row: the query (blue), then its nearest neighbours; a wrong label is framed red, the first correct
hit green (shown after the others when it ranks lower), other correct hits grey.</p>
<img src="worst.png" alt="worst queries">
<h2>Classes, worst first</h2><img src="classes.png" alt="per-class Recall@1 and MAP@R">
{_table(classes[:30], ["label", "queries", "recall_at_1", "map_at_r", "most_confused_with"])}
<p>All {len(classes)} classes: <a href="classes.csv">classes.csv</a>.</p>
<h2>Most confused label pairs</h2><p>Queries whose nearest neighbour carries the other label, either way.</p>
{_table(confusions[:20], ["label_a", "label_b", "count"])}
<p>All pairs: <a href="confusions.csv">confusions.csv</a>.</p>
<h2>Map of the embeddings</h2><p>t-SNE of {points} embeddings, coloured by label.</p>
<img src="map.png" alt="t-SNE map of the embeddings">
</body></html>
"""


def write_report(out: str | Path, metrics: dict[str, Any], names: Sequence[str], query: ReportSet,
                 gallery: ReportSet | None = None, k: int = 8, worst: int = 12, seed: int = 0) -> Path:
    """Write worst.png, classes.csv, classes.png, confusions.csv, map.png, metrics.json and report.html into
    `out` for queries searching a gallery (each other, themselves left out, when it is None); returns
    the path of report.html."""
    import matplotlib  # noqa: F401  (missing extra: fail before any work)
    import sklearn  # noqa: F401
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    g = query if gallery is None else gallery
    ranking = rank(query, gallery, k)
    worst_queries(ranking, query, g, names, k, worst).save(out / "worst.png")
    classes, confusions = class_table(ranking, query.labels, g.labels, names)
    _write_csv(out / "classes.csv", classes, ["label", "queries", "recall_at_1", "map_at_r", "most_confused_with"])
    _write_csv(out / "confusions.csv", confusions, ["label_a", "label_b", "count"])
    class_chart(classes, out / "classes.png")
    labelled = [ReportSet(s.vectors[s.labels >= 0], s.labels[s.labels >= 0],
                          lambda i, s=s, rows=np.flatnonzero(s.labels >= 0): s.load(int(rows[i])))
                for s in ([query] if gallery is None else [query, gallery])]
    points = embedding_map(labelled, out / "map.png", seed=seed)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    (out / "report.html").write_text(_html(metrics, classes, confusions, points))
    return out / "report.html"
