"""Deprecated: moved to metricsearch.train.cross_batch_memory (issue 87); this alias goes in the next release (0.2)."""

from metricsearch.train.deprecated_aliases import alias_module

alias_module(__name__, "metricsearch.train.cross_batch_memory")
