"""Embedding networks (torch) and the ONNX embedder used at run time, with their preprocessing."""

from metricsearch.models.backbones import BACKBONES
from metricsearch.models.embedder import Embedder, build_embedder, load_embedder
from metricsearch.models.preprocessing import Preprocessing

__all__ = ["BACKBONES", "Embedder", "Preprocessing", "build_embedder", "load_embedder"]
