"""The named steps of `index build`, in order, and the test hook that SIGKILLs the process at one:
METRICSEARCH_STOP_AT=<step> (its first arrival) or <step>:<n> (its n-th)."""

from __future__ import annotations

import os
import signal

STOP_ENV = "METRICSEARCH_STOP_AT"
BUILD_STEPS = (
    "locked",        # the writer lock is held; nothing else exists yet
    "databases",     # inside the transaction that creates LMDB's named databases
    "model_copied",  # the model is copied into the gallery; no metadata yet
    "created",       # the metadata and the job record are committed (state building)
    "batch",         # a batch of items is committed
    "embedded",      # every image is committed; no faiss index yet
    "faiss_file",    # the faiss file is written, its header not yet
    "faiss_saved",   # the faiss file and header are saved; the gallery is not marked ready yet
    "ready",         # the gallery is marked ready; no report yet
    "reported",      # report.json is written; the command is about to return
)
_arrivals: dict[str, int] = {}


def reached(step: str) -> None:
    """Mark that the build reached `step`; SIGKILL this process when METRICSEARCH_STOP_AT names it."""
    stop = os.environ.get(STOP_ENV)
    if not stop:
        return
    name, _, nth = stop.partition(":")
    if name != step:
        return
    _arrivals[step] = _arrivals.get(step, 0) + 1
    if _arrivals[step] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
