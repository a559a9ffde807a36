"""The base of metricsearch's own run-time errors, which the command line reports in one line."""


class MetricsearchError(RuntimeError):
    """A job cannot go on for a reason the message explains (a NaN loss, a failed parity check, ...)."""
