"""Embedding a whole ImageSet: images decoded and preprocessed in parallel threads, ahead of inference."""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator, TypeVar

import numpy as np

from metricsearch.data import ImageSet
from metricsearch.models.preprocessing import Preprocessing

T = TypeVar("T")


def default_workers() -> int:
    """Decoding threads: one per core, at most 8."""
    return max(1, min(8, os.cpu_count() or 1))


def ordered_batches(
    fn: Callable[[int], T], n: int, batch_size: int = 256, workers: int | None = None, prefetch: int = 2,
) -> Iterator[tuple[int, list[T]]]:
    """(start, [fn(start), ..., fn(stop - 1)]) for consecutive batches of range(n), in order, `fn`
    running in `workers` threads; `prefetch` batches are computed while one is used. An exception
    of `fn` is raised when its batch is reached, and the batches not reached yet are cancelled."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    starts = iter(range(0, n, batch_size))
    with ThreadPoolExecutor(workers or default_workers(), thread_name_prefix="decode") as pool:
        pending: deque[tuple[int, list[Future]]] = deque()

        def submit(start: int) -> None:
            stop = min(start + batch_size, n)
            pending.append((start, [pool.submit(fn, i) for i in range(start, stop)]))

        for start in starts:
            submit(start)
            if len(pending) > prefetch:
                break
        while pending:
            start, futures = pending.popleft()
            following = next(starts, None)
            if following is not None:
                submit(following)
            try:
                yield start, [f.result() for f in futures]
            except BaseException:
                for _, later in pending:
                    for f in later:
                        f.cancel()
                raise


def preprocessed_batches(
    images: ImageSet, preprocessing: Preprocessing, batch_size: int = 256, workers: int | None = None,
    prefetch: int = 2,
) -> Iterator[tuple[int, np.ndarray]]:
    """(start index, N x C x H x W float32 batch) in order; `prefetch` batches decode while one is used."""

    def one(i: int) -> np.ndarray:
        return preprocessing(images.load(i))

    for start, arrays in ordered_batches(one, len(images), batch_size, workers, prefetch):
        yield start, np.stack(arrays)


def embed_image_set(
    embed_arrays: Callable[[np.ndarray], np.ndarray],
    images: ImageSet,
    preprocessing: Preprocessing,
    batch_size: int = 256,
    workers: int | None = None,
    progress: bool = False,
    desc: str = "embedding",
) -> np.ndarray:
    """Embeddings (N x dim float32) of every image of `images`, in order, by `embed_arrays` on preprocessed batches."""
    from tqdm.auto import tqdm

    out = []
    with tqdm(total=len(images), desc=desc, disable=None if progress else True, leave=False, unit="img") as bar:
        for _, batch in preprocessed_batches(images, preprocessing, batch_size, workers):
            out.append(np.asarray(embed_arrays(batch), dtype=np.float32))
            bar.update(len(batch))
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)
