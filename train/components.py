"""The loss, batch sampler, miner and weighting a config names: built for a training set and checked to train
together."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from metricsearch.data import ImageSet
from metricsearch.train.config import TrainConfig
from metricsearch.train.context import TrainContext
from metricsearch.train.distributed import DistContext
from metricsearch.train.losses import build as build_loss
from metricsearch.train.losses.base import MetricLoss, Mined
from metricsearch.train.miners import build_miner
from metricsearch.train.samplers import LabelBatchSampler, build_sampler
from metricsearch.train.weightings import Weighting, build_weighting
from metricsearch.train.weightings.importance import ImportanceWeighting


def build_components(
    config: TrainConfig, images: ImageSet, dist: DistContext = DistContext(), embedding_dim: int | None = None,
) -> tuple[MetricLoss, LabelBatchSampler, Callable[..., Mined] | None, Weighting | None]:
    """The loss, batch sampler (this rank's share), miner and weighting a config names for `images`, checked to fit;
    `embedding_dim`, the model's training embedding's (`part_dim`), sizes a proxy loss's proxies."""
    context = TrainContext.of(images, embedding_dim=embedding_dim)
    loss_name, loss_params = config.component("loss")
    loss = build_loss(loss_name, context, **loss_params)
    sampler_name, sampler_params = config.component("sampler")
    sampler = build_sampler(sampler_name, context.labels, context.groups, seed=config.seed,
                            batches_per_epoch=config.batches_per_epoch, rank=dist.rank,
                            world_size=dist.world_size, **sampler_params)
    miner_name, miner_params = config.component("miner")
    miner = build_miner(miner_name, **miner_params) if miner_name else None
    weighting_name, weighting_params = config.component("weighting")
    weighting = (build_weighting(weighting_name, replace(context, sampler=sampler), **weighting_params)
                 if weighting_name else None)
    check_compatible(loss, miner, weighting, sampler)
    return loss, sampler, miner, weighting


def check_compatible(
    loss: MetricLoss,
    miner: Callable[..., Mined] | None = None,
    weighting: Weighting | None = None,
    sampler: LabelBatchSampler | None = None,
) -> None:
    """Raise a ValueError naming the clash when the components cannot train together."""
    loss_name = type(loss).__name__
    produces: Any = getattr(miner, "produces", None)
    if miner is not None and loss.mines == "none":
        raise ValueError(f"loss {loss_name} ignores mined pairs; drop the miner {type(miner).__name__}")
    if produces == "triplets" and loss.mines == "pairs":
        raise ValueError(
            f"miner {type(miner).__name__} yields triplets but loss {loss_name} takes pairs; "
            "use a pair miner (ms, random) or a triplet loss"
        )
    if produces == "pairs" and loss.mines == "triplets":
        raise ValueError(
            f"miner {type(miner).__name__} yields pairs but loss {loss_name} takes triplets; "
            "use a triplet miner (semihard, hard, batch_hard, distance_weighted) or a pair loss"
        )
    loss.check_weighting(weighting)
    if sampler is not None and sampler.fixes_pairs and loss.mines != "pairs":
        raise ValueError(
            f"sampler {type(sampler).__name__} fixes the pairs of each batch but loss {loss_name} needs "
            f"{'triplets' if loss.mines == 'triplets' else 'the whole batch'}; use a pair loss or the group sampler"
        )
    if isinstance(weighting, ImportanceWeighting):
        if weighting.sampler is not sampler:  # it was built, so its own sampler has a known design
            raise ValueError(
                "importance weighting was built for another sampler than the one training; build it "
                "with the training sampler in its context"
            )
