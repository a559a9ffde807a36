"""Deprecated alias of `metricsearch.models.image_set_embedding` (embedding a whole ImageSet); goes in 0.2."""

import warnings

from metricsearch.models import image_set_embedding

warnings.warn("metricsearch.models.batches is deprecated and goes in 0.2: import "
              "metricsearch.models.image_set_embedding", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> object:
    """`image_set_embedding`'s attribute `name`."""
    return getattr(image_set_embedding, name)
