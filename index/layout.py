"""Deprecated alias of `metricsearch.index.lmdb_store` (the gallery's LMDB store and layout); goes in 0.2."""

import warnings

from metricsearch.index import lmdb_store

warnings.warn("metricsearch.index.layout is deprecated and goes in 0.2: import metricsearch.index.lmdb_store",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> object:
    """`lmdb_store`'s attribute `name`."""
    return getattr(lmdb_store, name)
