"""metricsearch: train an image embedding, export it to ONNX, and search a gallery with it."""

__version__ = "0.1.0"
