"""The DRO pair weightings (TopK, TopK-PN, KL of `train/losses/dro.py`) as weightings by name."""

from __future__ import annotations

from metricsearch.train.losses.dro import DRO_WEIGHTINGS
from metricsearch.train.sampling.registry import register_weighting

for _name, _weighting in DRO_WEIGHTINGS.items():
    register_weighting(_name)(_weighting)
