"""Every loss of the five papers, and the proxy losses beyond them, built by name: `build(name, **params)`,
`names()`."""

from __future__ import annotations

from typing import Any

from metricsearch.train.context import TrainContext
from metricsearch.train.losses import (  # noqa: F401  # each module registers its losses in LOSSES
    arcface, binomial, contrastive, cosface, dro, ice, lifted, margin, ms, normsoftmax, npair, proxy_anchor, proxy_nca,
    soft_triple, triplet,
)
from metricsearch.train.deprecated_aliases import renamed_attribute
from metricsearch.train.losses.base import MetricLoss, Mined, PairLoss, label_masks, pair_masks
from metricsearch.train.losses.proxies import ProxyLoss
from metricsearch.train.losses.registry import LOSSES, register


def build(name: str, context: TrainContext | None = None, **params: Any) -> MetricLoss:
    """A loss module by registry name; the training context's fields reach only the losses that take them."""
    return LOSSES.build(name, context.as_dict() if context is not None else None, **params)


def names() -> list[str]:
    """Registered loss names."""
    return LOSSES.names()


def learns_proxies(name: str) -> bool:
    """Whether the loss of that name learns proxies (one of the losses beyond the five papers)."""
    factory = LOSSES.get(name)
    return isinstance(factory, type) and issubclass(factory, ProxyLoss)


def __getattr__(name: str) -> Any:
    """Deprecated names: `Weighting` moved to metricsearch.train.weightings (goes in the next release)."""
    return renamed_attribute(__name__, name, {"Weighting": "metricsearch.train.weightings.Weighting"})


__all__ = ["LOSSES", "MetricLoss", "Mined", "PairLoss", "ProxyLoss", "build", "learns_proxies",
           "names", "register", "label_masks", "pair_masks"]
