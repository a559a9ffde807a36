"""The index layer's thread policy: how many OpenMP threads faiss uses, set for a block and restored after."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import faiss


@contextmanager
def search_threads(n: int = 1) -> Iterator[None]:
    """faiss searches with `n` OpenMP threads inside the block; the process's count is restored after.

    A server runs many one-query searches side by side: one thread each, since OpenMP teams that
    wait for each other on a busy CPU made a one-query search many times slower."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)
