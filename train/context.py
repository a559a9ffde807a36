"""What training passes the losses, samplers and weightings about its training set (never set in a config)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from metricsearch.data import ImageSet


@dataclass(frozen=True)
class TrainContext:
    """The training set's labels, class sizes and groups, the batch sampler once built, and the embedding's
    dimension (the proxy losses' proxies have it)."""

    labels: np.ndarray
    class_counts: dict[int, int]
    num_classes: int
    num_images: int
    groups: np.ndarray | None = None  # each image's super-class (Omniglot: its alphabet), when the data set has them
    sampler: Any = None  # the LabelBatchSampler, for the weightings that correct for its design
    embedding_dim: int | None = None  # of the training embedding (Embedder.part_dim), once the model is built

    @classmethod
    def of(cls, images: ImageSet, sampler: Any = None, embedding_dim: int | None = None) -> "TrainContext":
        """The context of a training set (for a model whose embeddings have `embedding_dim` dimensions)."""
        return cls(np.asarray(images.labels), images.class_counts(), len(images.class_names), len(images),
                   images.groups, sampler, embedding_dim)

    def as_dict(self) -> dict[str, Any]:
        """Its fields by name, and itself as `context`, as a registry passes them to the factories that take them."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        return {"context": self, **own}


#: the parameter names a component receives from the TrainContext rather than from its config section: a field,
#: or `context`, the whole TrainContext (for a loss that builds another one, as the dro_* losses build their base)
CONTEXT_KEYS: tuple[str, ...] = ("context", *(f.name for f in fields(TrainContext)))
