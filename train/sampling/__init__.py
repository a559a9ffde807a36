"""Deprecated: samplers, miners and weightings each have their folder now (train/samplers/, train/miners/,
train/weightings/; issue 87). This package and its old modules (sampling.group, sampling.miners, ...) are aliases of
them; they go in the next release (0.2)."""

from __future__ import annotations

import sys

from metricsearch.train import components, miners, samplers, weightings
from metricsearch.train.context import TrainContext
from metricsearch.train.deprecated_aliases import warn_renamed
from metricsearch.train.losses.base import Mined
from metricsearch.train.miners import MINERS, build_miner, register_miner
from metricsearch.train.samplers import SAMPLERS, LabelBatchSampler, build_sampler, register_sampler
from metricsearch.train.weightings import WEIGHTINGS, Weighting, build_weighting, register_weighting

warn_renamed(__name__, "metricsearch.train.samplers, metricsearch.train.miners or metricsearch.train.weightings")

#: each old module path and the module that holds its code now (sampling.registry: this package, whose names it had)
for _old, _new in {"base": samplers.base, "group": samplers.group, "p_random": samplers.p_random,
                   "super_class": samplers.super_class, "hard_class": samplers.hard_class,
                   "random_batches": samplers.random_batches, "miners": miners,
                   "distance_weighted": miners.distance_weighted, "importance": weightings.importance,
                   "dro": weightings.dro, "compat": components, "registry": sys.modules[__name__]}.items():
    sys.modules[f"{__name__}.{_old}"] = _new

__all__ = ["MINERS", "SAMPLERS", "WEIGHTINGS", "LabelBatchSampler", "Mined", "TrainContext", "Weighting", "build_miner",
           "build_sampler", "build_weighting", "register_miner", "register_sampler", "register_weighting"]
