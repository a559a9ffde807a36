"""Freed memory kept in the process heap while a CPU trains (glibc), so large tensors reuse its pages."""

from __future__ import annotations

import ctypes
import platform
from contextlib import contextmanager
from typing import Iterator

import torch

#: glibc's mallopt parameters (malloc.h) and their defaults, restored afterwards
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_DEFAULT_TRIM_THRESHOLD, _DEFAULT_MMAP_MAX = 128 * 1024, 65536
_NEVER_TRIM = 2**31 - 1


def has_glibc() -> bool:
    """Whether this process runs on glibc, whose allocator `kept_heap` tunes."""
    return platform.libc_ver()[0] == "glibc"


def keep_heap(device: torch.device, setting: str | bool = "auto", glibc: bool | None = None) -> bool:
    """Whether training keeps freed memory in the heap: `auto` on a CPU with glibc, `true` anywhere glibc runs."""
    if setting not in ("auto", True, False):
        raise ValueError(f"keep_heap must be auto, true or false, got {setting!r}")
    glibc = has_glibc() if glibc is None else glibc
    if setting is True and not glibc:
        raise ValueError("keep_heap: true needs glibc (Linux) and this process has another C library; "
                         "set keep_heap: auto or false")
    return glibc and (setting is True or (setting == "auto" and device.type == "cpu"))


@contextmanager
def kept_heap(enabled: bool = True) -> Iterator[None]:
    """While the block runs, every allocation comes from glibc's heap and freed memory stays there.

    By default glibc maps each block over 32 MB afresh and unmaps it when freed, so every step of a CPU training
    pays for new zeroed pages (bench/train_heap.py: EfficientNet-Lite0's trunk cache took 2x as long). Afterwards
    glibc's limits are set back to its defaults and the heap is trimmed.
    """
    if not enabled:
        yield
        return
    libc = ctypes.CDLL(None)
    libc.mallopt(_M_MMAP_MAX, 0)
    libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
        libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
        libc.malloc_trim(0)
