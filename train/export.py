"""Export a trained embedder, or a pretrained backbone's features off the shelf, to ONNX with its preprocessing in
the metadata, checked for parity."""

from __future__ import annotations

import copy
import functools
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image

import metricsearch
from metricsearch.errors import MetricsearchError
from metricsearch.data import load_image_set
from metricsearch.models.torch_embedder import Embedder, load_checkpoint, resolve_checkpoint
from metricsearch.models.onnx_embedder import METADATA_PREFIX, OnnxEmbedder
from metricsearch.train.checkpoint_data import run_split, sample_batch
from metricsearch.train.projection import Projected, projected
from metricsearch.train.whitening import change_views

if TYPE_CHECKING:
    import onnx

INPUT_NAME, OUTPUT_NAME = "images", "embeddings"


class ExportError(MetricsearchError):
    """The exported model does not reproduce the torch model."""


@dataclass
class ExportReport:
    """Where the model went and how closely onnxruntime matches torch."""

    path: Path
    max_abs_diff: float
    batch_size: int
    embedding_dim: int


def add_metadata(proto: onnx.ModelProto, entries: dict[str, str]) -> None:
    """Add `entries` to an ONNX model's metadata under the keys the ONNX embedder reads (prefixed)."""
    for key, value in entries.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = METADATA_PREFIX + key, value


def check_parity(model: Embedder, onnx_path: str | Path, batch: np.ndarray, atol: float = 1e-4) -> float:
    """Max |torch - onnxruntime| on `batch` (N x C x H x W); ExportError above `atol`."""
    model = model.eval().cpu()
    with torch.no_grad():
        expected = model(torch.from_numpy(batch)).numpy()
    got = OnnxEmbedder(onnx_path, device="cpu").embed_arrays(batch)
    diff = float(np.abs(expected - got).max()) if expected.shape == got.shape else float("inf")
    if not diff <= atol:
        raise ExportError(
            f"ONNX parity check failed: max |torch - onnxruntime| = {diff:.3g} > {atol:g} on a batch of "
            f"{len(batch)} (shapes {expected.shape} vs {got.shape}); the exported file is not usable"
        )
    return diff


def check_out(out: str | Path, overwrite: bool) -> Path:
    """`out` as a Path, if it may be written: its folder exists, and it does not or `overwrite` is set."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; replace it with --overwrite (overwrite=True in Python) "
                              "or choose another --out")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"the folder {out.parent} of {out} does not exist; create it or choose another --out")
    return out


def export_onnx(
    model: Embedder | str | Path, out: str | Path, batch: np.ndarray | None = None, *,
    dataset: str | None = None, batch_size: int = 32, source: str = "", opset: int = 17, atol: float = 1e-4,
    overwrite: bool = False, views: dict[str, list] | None = None, dim: int | None = None,
    whiten_projection: bool = False, fit_images: str | None = None,
) -> ExportReport:
    """Write a model, or a run directory's / checkpoint's, as ONNX (dynamic batch axis, metadata) to `out`,
    checked for parity on `batch` (default: `batch_size` test images of the run's data set, or of `dataset`).
    `views` (from `check_views`: model keys tta_shifts, tta_rotations, tta_symmetries) replaces the test-time
    views: fewer make a faster graph; a whitened run's matrix is fit again on its training images for other shifts
    or rotations. `dim` appends a PCA projection to that many dimensions (whitened with `whiten_projection`),
    re-normalised, fit on the images of the spec `fit_images` (default: a run's training images); the file's
    metadata `projection` says what it was fit on. A run whose config has `model.project` gets that projection
    unless `dim` is given; `dim=0`: none.
    An existing `out` is replaced only with `overwrite`; its folder must exist."""
    import onnx

    out = check_out(out, overwrite)
    in_memory = isinstance(model, Embedder)
    if not in_memory:
        source = source or str(resolve_checkpoint(model))
        model, state = load_checkpoint(model)
        own_split = functools.cache(lambda: run_split(state))  # loaded once, and only when needed
        project = (state.get("config", {}).get("model") or {}).get("project")
        if dim is None and project:
            dim, whiten_projection = project["dim"], project.get("whiten", False)
        if batch is None:
            split = own_split() if dataset is None else run_split(state, dataset)
            batch = sample_batch(model.preprocessing, split.test if len(split.test) else split.train, batch_size)
    if batch is None:
        raise ValueError("export_onnx of an in-memory model needs a parity batch")
    if views and in_memory:
        model = copy.deepcopy(model)  # the caller's model keeps its views
    model = model.eval().cpu()
    if views:
        change_views(model, None if in_memory else lambda: own_split().train, views.get("tta_shifts"),
                     views.get("tta_rotations"), views.get("tta_symmetries"))
    if dim:
        if fit_images is None and in_memory:
            raise ValueError("--dim needs --fit-images SPEC: the images whose embeddings the projection is fit on")
        images = load_image_set(fit_images) if fit_images is not None else own_split().train
        model = projected(model, images, fit_images or "the run's training images", dim, whiten_projection)
    example = torch.from_numpy(batch[:2])
    with warnings.catch_warnings():
        # the exporter warns, once per pass, that it cannot fold the strided slices of the shifted test views;
        # the graph is still exact (check_parity below), so only that warning is silenced
        warnings.filterwarnings("ignore", message="Constant folding - Only steps=1 can be constant folded",
                                category=UserWarning)
        torch.onnx.export(
            model, (example,), str(out), input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            opset_version=opset, dynamo=False,
        )
    proto = onnx.load(str(out))
    meta = {
        "preprocessing": model.preprocessing.to_json(),
        "embedding_dim": str(model.dim),
        "normalized": json.dumps(bool(model.normalize)),
        "backbone": model.config["backbone"],
        "model_config": json.dumps(model.config, sort_keys=True),
        "version": metricsearch.__version__,
        "source": source,
    }
    if isinstance(model, Projected):
        meta["projection"] = model.description
    add_metadata(proto, meta)
    proto.producer_name = "metricsearch"
    onnx.checker.check_model(proto)
    onnx.save(proto, str(out))
    try:
        diff = check_parity(model, out, batch, atol)
    except ExportError:
        out.unlink(missing_ok=True)
        raise
    return ExportReport(out, diff, len(batch), model.dim)


def export_pretrained(
    backbone: str, out: str | Path, pretrained: str | bool = "imagenet", *, images: str | None = None,
    batch_size: int = 32, opset: int = 17, atol: float = 1e-4, overwrite: bool = False, dim: int | None = None,
    whiten_projection: bool = False, fit_images: str | None = None,
) -> ExportReport:
    """Write a backbone's pooled, L2-normalised features (no training, no head) as an ONNX embedder to `out`,
    with the backbone's own preprocessing, checked for parity on `batch_size` images of the spec `images`
    (default: seeded random-pixel photos); `dim`: a PCA projection fit on `fit_images` appended (export_onnx).
    An existing `out` is replaced only with `overwrite`."""
    check_out(out, overwrite)
    model = Embedder(backbone, dim=None, normalize=True, pretrained=pretrained)
    pre = model.preprocessing
    if images is not None:
        batch = sample_batch(pre, load_image_set(images), batch_size)
    else:
        rng = np.random.default_rng(0)
        batch = pre.batch([Image.fromarray(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8))
                           for _ in range(max(1, batch_size))])
    return export_onnx(model, out, batch, source=f"{backbone} pretrained={pretrained}, no training",
                       opset=opset, atol=atol, overwrite=overwrite, dim=dim, whiten_projection=whiten_projection,
                       fit_images=fit_images)
