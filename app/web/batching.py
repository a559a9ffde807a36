"""Merging concurrent inference calls into one batch, without making any caller wait for a timer."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable, Generic, Sequence, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class Coalescer(Generic[Item, Result]):
    """Calls `fn(items) -> results` (one result per item) for items submitted from many threads.

    A caller that finds no call running runs `fn` at once on everything waiting (its own item
    included, up to `max_batch`); callers that arrive meanwhile wait, and one of them runs the
    next call on all of them. So a lone request never waits for a timer, requests that arrive
    together share one inference call, and no caller serves other callers' batches for long.
    When `fn` raises for a batch of several items, each item runs again alone: an exception goes
    only to the caller whose item raises it, never to the others that shared its call.
    """

    def __init__(self, fn: Callable[[list[Item]], Sequence[Result]], max_batch: int = 32) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._fn = fn
        self._max_batch = max_batch
        self._cond = threading.Condition()
        self._pending: list[tuple[Item, Future]] = []
        self._running = False
        #: sizes of the latest batches (at most 1000), newest last: how much merging happened
        self.batch_sizes: list[int] = []

    @property
    def waiting(self) -> int:
        """How many queries wait for the next inference call."""
        with self._cond:
            return len(self._pending)

    def __call__(self, item: Item) -> Result:
        """The result of `item`, computed in one call together with whatever else is waiting."""
        return self.map([item])[0]

    def map(self, items: Sequence[Item]) -> list[Result]:
        """The results of several items, in order: they join the waiting items as one caller's (a batch request)."""
        futures: list[Future] = [Future() for _ in items]
        with self._cond:
            self._pending.extend(zip(items, futures))
        while not all(future.done() for future in futures):
            with self._cond:
                while self._running and not all(future.done() for future in futures):
                    self._cond.wait()
                if all(future.done() for future in futures):
                    break
                self._running = True
                batch, self._pending = self._pending[:self._max_batch], self._pending[self._max_batch:]
                self.batch_sizes = self.batch_sizes[-999:] + [len(batch)]
            try:
                self._run(batch)
            finally:
                with self._cond:
                    self._running = False
                    self._cond.notify_all()
        return [future.result() for future in futures]

    def _run(self, batch: list[tuple[Item, Future]]) -> None:
        try:
            results = list(self._fn([item for item, _ in batch]))
            if len(results) != len(batch):
                raise RuntimeError(f"batch function returned {len(results)} results for {len(batch)} items")
        except Exception as exc:
            if len(batch) == 1:
                batch[0][1].set_exception(exc)
            else:  # which item failed the call? each alone finds out
                for one in batch:
                    self._run([one])
            return
        except BaseException as exc:  # every caller in the batch must be woken, whatever happened
            for _, future in batch:
                future.set_exception(exc)
            raise
        for (_, future), result in zip(batch, results):
            future.set_result(result)
