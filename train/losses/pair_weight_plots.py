"""Plots of the General Pair Weighting |dL/dS_ij| of losses against S_ij, for comparing losses."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

from metricsearch.train.context import TrainContext
from metricsearch.train.losses.base import MetricLoss


def random_batch(
    n_classes: int = 8, per_class: int = 8, dim: int = 64, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """A clustered batch: per_class noisy copies of n_classes random centres (float32, labels 0..n-1)."""
    if n_classes < 1 or per_class < 1 or dim < 1:
        raise ValueError(
            f"n_classes, per_class and dim must be >= 1, got {n_classes}, {per_class}, {dim}"
        )
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(n_classes, dim, generator=gen)
    centres = centres / centres.norm(dim=1, keepdim=True)
    noise = torch.randn(n_classes, per_class, dim, generator=gen) * (1.2 / math.sqrt(dim))
    embeddings = (centres[:, None, :] + noise).reshape(n_classes * per_class, dim)
    labels = torch.arange(n_classes).repeat_interleave(per_class)
    return embeddings, labels


def plot_pair_weights(
    losses: dict[str, MetricLoss], embeddings: Tensor, labels: Tensor, out_path: str | Path
) -> Path:
    """Save a PNG with one panel per loss: pair weight |dL/dS_ij| against S_ij, positives vs negatives (for a proxy
    loss, j is a proxy: its own class's or another's)."""
    if not losses:
        raise ValueError("losses must name at least one loss to plot")
    cols = min(3, len(losses))
    rows = math.ceil(len(losses) / cols)
    fig = Figure(figsize=(4.5 * cols, 3.6 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    for index, (name, loss) in enumerate(losses.items()):
        ax = fig.add_subplot(rows, cols, index + 1)
        sim, weights, pos, neg = loss.weighted_pairs(embeddings, labels)
        nonzero = weights > 0
        for mask, colour, kind in ((pos, "tab:blue", "positive"), (neg, "tab:red", "negative")):
            shown = mask & nonzero
            ax.scatter(
                sim[shown].cpu().numpy(), weights[shown].cpu().numpy(), s=6, alpha=0.5,
                color=colour, label=f"{kind} ({int(shown.sum())}/{int(mask.sum())} non-zero)",
            )
        if nonzero.any():
            ax.set_yscale("log")
        ax.set_title(name)
        ax.set_xlabel("similarity S_ij" if loss.normalize else "dot product S_ij")
        ax.set_ylabel("pair weight |dL/dS_ij|")
        ax.legend(fontsize="small")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def inspect_loss(
    names: list[str], out: str | Path, *, checkpoint: str | Path | None = None, dataset: str | None = None,
    classes: int = 8, per_class: int = 8, dim: int = 64, seed: int = 0,
) -> Path:
    """Plot the pair weights of the named losses on one batch: a trained model's test embeddings, else a random one."""
    from metricsearch.train import losses as registry

    if checkpoint is not None:
        from metricsearch.models.torch_embedder import load_checkpoint
        from metricsearch.train.checkpoint_data import run_split
        from metricsearch.train.samplers import build_sampler

        model, state = load_checkpoint(checkpoint)
        test = run_split(state, dataset).test
        sampler = build_sampler("group", test.labels, classes_per_batch=classes, images_per_class=per_class,
                                seed=seed)
        batch = test.subset(next(iter(sampler)))
        embeddings = torch.from_numpy(model.embed_set(batch))
        labels = torch.as_tensor(batch.labels)
    else:
        embeddings, labels = random_batch(classes, per_class, dim, seed)
    counts = {int(c): int((labels == c).sum()) for c in labels.unique()}
    context = TrainContext(labels.numpy(), counts, int(labels.max()) + 1, len(labels),
                           embedding_dim=embeddings.shape[1])
    return plot_pair_weights({name: registry.build(name, context) for name in names}, embeddings, labels, out)
