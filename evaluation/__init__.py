"""Retrieval metrics (Recall@K, MAP@R, NMI, one-shot accuracy) and the evaluation of an embedder; no torch."""

from metricsearch.evaluation.metrics import evaluate, nmi, one_shot_accuracy, ranked_metrics, retrieval_metrics
from metricsearch.evaluation.run import SetEmbedder, evaluate_model, evaluate_split

__all__ = ["SetEmbedder", "evaluate", "evaluate_model", "evaluate_split", "nmi", "one_shot_accuracy",
           "ranked_metrics", "retrieval_metrics"]
