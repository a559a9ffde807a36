"""Deprecated alias of `metricsearch.index.build_steps` (the named steps of `index build`); goes in 0.2."""

import warnings

from metricsearch.index import build_steps

warnings.warn("metricsearch.index.steps is deprecated and goes in 0.2: import metricsearch.index.build_steps",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> object:
    """`build_steps`'s attribute `name`."""
    return getattr(build_steps, name)
