"""Retrieval metrics (Recall@K, MAP@R, NMI, one-shot accuracy) and the evaluation of an embedder; no torch."""

from metricsearch.evaluation.metrics import evaluate, nmi, ranked_metrics, retrieval_metrics
from metricsearch.evaluation.oneshot import PROTOCOLS, one_shot_accuracy, one_shot_error
from metricsearch.evaluation.metrics_text import format_metrics
from metricsearch.evaluation.run import SetEmbedder, evaluate_model, evaluate_split

__all__ = ["PROTOCOLS", "SetEmbedder", "evaluate", "evaluate_model", "evaluate_split", "format_metrics", "nmi",
           "one_shot_accuracy", "one_shot_error", "ranked_metrics", "retrieval_metrics"]
