"""Deprecated alias of `metricsearch.evaluation.metrics_text` (an evaluation result as text); goes in 0.2."""

import warnings

from metricsearch.evaluation import metrics_text

warnings.warn("metricsearch.evaluation.text is deprecated and goes in 0.2: import "
              "metricsearch.evaluation.metrics_text", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> object:
    """`metrics_text`'s attribute `name`."""
    return getattr(metrics_text, name)
