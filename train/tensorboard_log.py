"""TensorBoard event files of a training run (`logging.tensorboard: true`), in RUN_DIR/tensorboard/.

Every scalar of a metrics.jsonl row (loss, learning rate, images/s, each evaluation metric) goes in as it
is, at step = epoch (the test classes' final record under test/, the off-the-shelf features' under off_the_shelf/):
metrics.jsonl stays the record, the event files a view of it. At each evaluation (on the validation classes)
they also get the histograms of positive and negative pair similarities of a batch of validation images,
and the loss's General Pair Weighting picture on that batch (`inspect-loss`), also saved as
RUN_DIR/pair_weights.png; not for a proxy loss, whose pairs are with the training classes' proxies, which held-out
classes have none of.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from PIL import Image

from metricsearch.data import ImageSet
from metricsearch.errors import MetricsearchError
from metricsearch.models.torch_embedder import Embedder
from metricsearch.train.hooks import Hook
from metricsearch.train.losses.base import MetricLoss, label_masks
from metricsearch.train.losses.pair_weight_plots import plot_pair_weights
from metricsearch.train.losses.proxies import ProxyLoss
from metricsearch.train.samplers import build_sampler

#: the held-out batch of the histograms and the pair-weight picture: classes x images per class
BATCH_CLASSES, BATCH_PER_CLASS = 8, 8


def scalars(row: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """(tag, value) of every number in a metrics row, nested keys joined by "/" (recall_at_k/1)."""
    for key, value in row.items():
        if isinstance(value, dict):
            yield from scalars(value, f"{prefix}{key}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and key != "epoch":
            yield f"{prefix}{key}", float(value)


class Board:
    """A run's TensorBoard writer: `row` after each epoch, `evaluation` after each evaluation, `close` at the end."""

    def __init__(self, run_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise MetricsearchError("logging.tensorboard needs the tensorboard package: pip install "
                                    "'metricsearch[train]' (or set logging.tensorboard=false)") from None
        self.run_dir = Path(run_dir)
        self.writer = SummaryWriter(str(self.run_dir / "tensorboard"))

    def row(self, row: dict[str, Any], prefix: str = "") -> None:
        """A metrics.jsonl record, every scalar at step = its epoch, its tag after `prefix` (test/: the final record,
        off_the_shelf/: the off-the-shelf features', at epoch 0)."""
        for tag, value in scalars(row, prefix):
            self.writer.add_scalar(tag, value, int(row["epoch"]))
        self.writer.flush()

    def evaluation(self, epoch: int, model: Embedder, images: ImageSet, loss: MetricLoss, seed: int = 0) -> None:
        """Similarity histograms and the pair-weight picture of `loss` on one batch of `images` (the validation
        classes'), at step `epoch`."""
        sampler = build_sampler("group", images.labels, classes_per_batch=min(BATCH_CLASSES, len(set(images.labels))),
                                images_per_class=BATCH_PER_CLASS, seed=seed)
        batch = images.subset(next(iter(sampler)))
        device = next((p.device for p in loss.parameters()), torch.device("cpu"))
        embeddings = torch.from_numpy(model.embed_set(batch)).to(device)
        labels = torch.as_tensor(np.asarray(batch.labels), device=device)
        with torch.no_grad():
            sim = loss.similarity(embeddings)
        positive, negative = label_masks(labels)
        self.writer.add_histogram("similarity/positive", sim[positive].cpu(), epoch)
        self.writer.add_histogram("similarity/negative", sim[negative].cpu(), epoch)
        if not isinstance(loss, ProxyLoss):  # a proxy loss's pairs are with the training classes' proxies
            picture = plot_pair_weights({type(loss).__name__: loss}, embeddings, labels,
                                        self.run_dir / "pair_weights.png")
            with Image.open(picture) as image:
                self.writer.add_image("pair_weights", np.asarray(image.convert("RGB")), epoch, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


class TensorBoardHook(Hook):
    """The `logging.tensorboard` key in a run (rank 0): a Board opened in the run directory gets every record of
    metrics.jsonl and, after each evaluation, the picture of `loss` on a batch of the validation `images`."""

    def __init__(self, model: Embedder, images: ImageSet | None, loss: MetricLoss, seed: int = 0) -> None:
        self.model, self.images, self.loss, self.seed = model, images, loss, seed
        self.board: Board | None = None

    def on_run_start(self, run_dir: Path) -> None:
        self.board = Board(run_dir)

    def on_evaluated(self, epoch: int) -> None:
        self.board.evaluation(epoch + 1, self.model, self.images, self.loss, self.seed)

    def on_record(self, record: dict[str, Any], prefix: str = "") -> None:
        self.board.row(record, prefix)

    def close(self) -> None:
        if self.board is not None:
            self.board.close()
