"""Deprecated: moved to metricsearch.train.checkpoint_data (issue 87); this alias goes in the next release (0.2)."""

from metricsearch.train.deprecated_aliases import alias_module

alias_module(__name__, "metricsearch.train.checkpoint_data")
