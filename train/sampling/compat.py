"""Start-up checks that a loss, miner, weighting and sampler can be combined."""

from __future__ import annotations

from typing import Any, Callable

from metricsearch.train.losses.base import Mined, MetricLoss, Weighting
from metricsearch.train.sampling.base import LabelBatchSampler
from metricsearch.train.sampling.importance import ImportanceWeighting


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
