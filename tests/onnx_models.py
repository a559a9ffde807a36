"""Tiny real ONNX embedders for tests and benches, written with onnx's helper in milliseconds (no training)."""

from __future__ import annotations

import json
from pathlib import Path


def pixel_correlation_onnx(path: Path, size: int = 12, channels: int = 3, resize: str = "stretch") -> Path:
    """An ONNX embedder of an image's centred, L2-normalised size x size pixels (`channels` 1 or 3, preprocessed by
    the `resize` policy): the cosine of two embeddings is their pixel correlation. An instance-level model: a
    class-trained one (the digits model) pulls every image of a class together, so it cannot tell a copy from a
    sibling."""
    from onnx import TensorProto, helper

    dim = channels * size * size
    nodes = [helper.make_node("Flatten", ["images"], ["flat"], axis=1),
             helper.make_node("ReduceMean", ["flat"], ["mean"], axes=[1], keepdims=1),
             helper.make_node("Sub", ["flat", "mean"], ["centred"]),
             helper.make_node("LpNormalization", ["centred"], ["embedding"], axis=1, p=2)]
    graph = helper.make_graph(
        nodes, "pixel_correlation",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["n", channels, size, size])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["n", dim])])
    preprocessing = {"size": size, "channels": channels, "mean": [0] * channels, "std": [1] * channels,
                     "resize": resize}
    return saved_embedder(graph, preprocessing, dim, path)


def wide_onnx(path: Path, size: int = 224, width: int = 64) -> Path:
    """An ONNX embedder whose activations are wide: a 3 x 3 convolution to `width` maps at full resolution (12.8 MB
    an image at 224 px and width 64), pooled: a batch of 64 takes about 1 GB at its peak."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(0).normal(size=(width, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["images", "w"], ["maps"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["maps"], ["active"]),
             helper.make_node("GlobalAveragePool", ["active"], ["pooled"]),
             helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
             helper.make_node("LpNormalization", ["flat"], ["embedding"], axis=1, p=2)]
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                                            ["n", 3, size, size])],
                              [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["n", width])],
                              [numpy_helper.from_array(weights, "w")])
    preprocessing = {"size": size, "channels": 3, "mean": [0.5] * 3, "std": [0.5] * 3, "resize": "stretch"}
    return saved_embedder(graph, preprocessing, width, path)


def saved_embedder(graph, preprocessing: dict, dim: int, path: Path) -> Path:
    """An ONNX graph (input `images`, output `embedding`) saved to `path` as a metricsearch embedder: opset 17,
    with the metadata that `OnnxEmbedder` reads."""
    from onnx import checker, helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for key, value in {"preprocessing": json.dumps(preprocessing), "embedding_dim": str(dim),
                       "normalized": "true"}.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = "metricsearch." + key, value
    checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path
