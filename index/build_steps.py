"""The named steps of `index build`, in order, and the observers told as a build reaches each one
(tests kill a real build at a step through one: tests/workers/kill_at_step.py)."""

from __future__ import annotations

from typing import Callable

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
_observers: list[Callable[[str], None]] = []


def observe_steps(observer: Callable[[str], None]) -> None:
    """Call `observer(step)` each time a build or add in this process reaches one of BUILD_STEPS."""
    _observers.append(observer)


def reached(step: str) -> None:
    """Tell the observers that the build reached `step`."""
    for observer in _observers:
        observer(step)
