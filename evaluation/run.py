"""Evaluating an embedder on a data set spec, or on query and gallery specs: load, embed, measure."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from metricsearch.data import DataSplit, ImageSet, load_image_set, load_query_gallery, load_split
from metricsearch.data.base import RECALL_K_INSHOP
from metricsearch.evaluation.distances import centred, check_center
from metricsearch.evaluation.expansion import expand_gallery
from metricsearch.evaluation.metrics import evaluate


class SetEmbedder(Protocol):
    """Anything that embeds a whole ImageSet (OnnxEmbedder, PixelEmbedder, the trainer's model)."""

    def embed_set(self, images: ImageSet, batch_size: int | None = None, progress: bool = False) -> np.ndarray:
        """Embeddings (N x dim float32) of every image, in order (batch_size None: the embedder's choice)."""


def _reported(result: dict[str, Any], report: str | Path | None, query: ImageSet, q: np.ndarray,
              gallery: ImageSet | None = None, g: np.ndarray | None = None) -> dict[str, Any]:
    """`result`, after writing the report of these embeddings into `report` when it is given."""
    if report is not None:
        from metricsearch.evaluation.report import ReportSet, write_report

        write_report(report, result, query.class_names, ReportSet(q, query.labels, query.load),
                            None if gallery is None else ReportSet(g, gallery.labels, gallery.load))
    return result


def _gallery_result(query: ImageSet, q: np.ndarray, gallery: ImageSet, g: np.ndarray, recall_k: Sequence[int],
                    with_nmi: bool, center: float, report: str | Path | None) -> dict[str, Any]:
    """`evaluate` of the queries against the gallery, centred by `center`; its report from the same embeddings."""
    result = evaluate(q, query.labels, g, gallery.labels, recall_k, with_nmi, center=center)
    if report is None:
        return result
    q, g = centred(q, g, center)  # the report shows the comparisons that were scored
    return _reported(result, report, query, q, gallery, g)


def evaluate_split(
    embed: Callable[[ImageSet], np.ndarray],
    split: DataSplit,
    recall_k: Sequence[int] | None = None,
    with_nmi: bool = True,
    one_shot_ways: int | None = None,
    one_shot_protocol: str | None = None,
    report: str | Path | None = None,
    center: float = 0.0,
) -> dict[str, Any]:
    """`evaluate` of an embedding function on a split's test classes: its queries against its
    gallery where it has them (In-Shop), else every test image against the others (and one-shot
    episodes of `one_shot_protocol` over the test images' groups and sources, see evaluation.oneshot), centred by
    `center` (see evaluation.metrics.evaluate);
    with `report`, also the report of where it fails (evaluation.report) in that folder."""
    recall_k = recall_k or split.recall_k
    if split.query is not None and split.gallery is not None:
        q, g = embed(split.query), embed(split.gallery)
        return _gallery_result(split.query, q, split.gallery, g, recall_k, with_nmi, center, report)
    test = split.test
    x = embed(test)
    return _reported(evaluate(x, test.labels, recall_k=recall_k, with_nmi=with_nmi, one_shot_ways=one_shot_ways,
                              one_shot_protocol=one_shot_protocol, groups=test.groups, sources=test.sources,
                              center=center),
                     report, test, x)


def evaluate_model(
    model: SetEmbedder,
    *,
    dataset: str | None = None,
    query: str | None = None,
    gallery: str | None = None,
    split_classes: float | None = None,
    recall_k: Sequence[int] | None = None,
    with_nmi: bool = True,
    one_shot_ways: int | None = None,
    one_shot_protocol: str | None = None,
    center: float = 0.0,
    expand_with: str | None = None,
    batch_size: int | None = None,
    progress: bool = False,
    report: str | Path | None = None,
) -> dict[str, Any]:
    """Recall@K, NMI and MAP@R of `model` on a data set's test classes, or of query specs against a gallery
    spec (with `expand_with`, an unlabelled image spec from the queries' domain, the gallery expanded with it:
    `expand_gallery`); with `report`, also the report of where it fails in that folder. Inference batches of
    `batch_size` images (None: the model's choice; an ArrayEmbedder's keeps its process within its `memory`
    budget)."""
    if (query is None) != (gallery is None):
        raise ValueError("query and gallery go together: pass both, or a dataset")
    if (query is None) == (dataset is None):
        raise ValueError("pass either a dataset spec, or query and gallery specs")
    if expand_with is not None and query is None:
        raise ValueError("expand_with expands a gallery: pass query and gallery specs with it (--query, --gallery)")
    check_center(center, query is not None, bool(one_shot_ways and one_shot_protocol))  # before embedding anything

    def embed(images: ImageSet) -> np.ndarray:
        return model.embed_set(images, batch_size=batch_size, progress=progress)

    if query is not None:
        qs, gs = load_query_gallery(query, gallery)
        q, g = embed(qs), embed(gs)
        if expand_with is not None:
            g = expand_gallery(g, embed(load_image_set(expand_with)))
        return _gallery_result(qs, q, gs, g, recall_k or RECALL_K_INSHOP, with_nmi, center, report)
    split = load_split(dataset, split_classes=split_classes)
    for note in split.notes:
        print(f"data: {note}", file=sys.stderr)
    return evaluate_split(embed, split, recall_k, with_nmi, one_shot_ways, one_shot_protocol, report, center)
