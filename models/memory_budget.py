"""Batch sizes that keep a batch job's peak memory (resident set) within a budget, measured on the model itself.

An inference batch of N images needs N times what one image's activations take at their peak (the model
decides: 10 MB for EfficientNet-Lite0 at 224 px, 50 kB for the digits CNN), and the job holds a few
preprocessed batches besides (decoded ahead of inference). `batch_within` measures the first on the model
(one probe batch, with onnxruntime's memory arena off so that what a batch takes is given back after it)
and divides what the budget leaves by the sum.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from pathlib import Path
from typing import Callable

import numpy as np

#: the default budget of a batch job's peak resident memory, in bytes (`--memory`, in GB)
DEFAULT_MEMORY = 2 * 2**30
#: the largest batch chosen on a CPU (beyond it a CPU gains no speed: 960 photos of 224 px were indexed in 7.3 s
#: with batches of 64, 11.3 s with 256) and on a GPU
MAX_BATCH, MAX_BATCH_GPU = 64, 256
#: the share of the budget that the estimate may fill: the job's other buffers (decoding threads, the writer's
#: queue, the allocator's slack) take the rest
SAFE_SHARE = 0.75
#: images in the probe batch
PROBE = 8
#: preprocessed batches a job holds at once besides the one in inference (decoded ahead, and stacked)
HELD_BATCHES = 4
#: where the peak cannot be measured (not Linux): one image's peak as this many times its input's bytes
UNMEASURED_FACTOR = 48
_STATUS = Path("/proc/self/status")


def memory_gb(text: str) -> int:
    """A `--memory` value in GB (a positive number, at most 1 TB) as bytes; ValueError saying what to pass."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.05 <= value <= 1024:
        raise ValueError(f"--memory must be a number of GB between 0.05 and 1024, got {text!r}")
    return int(value * 2**30)


def resident_bytes(key: str = "VmRSS") -> int | None:
    """This process's resident memory now (VmRSS) or at its peak since the last reset (VmHWM); None off Linux."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS, Windows)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c")), "malloc_trim", None)
    except OSError:
        return None


def _give_back_free_heap() -> None:
    """Return the C heap's free pages to the system, so that the resident set counts only memory in use (a
    process that freed a large batch keeps its pages resident, and a later batch would reuse them unseen)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def peak_of(fn: Callable[[], object]) -> int | None:
    """How far this process's resident memory rose above its value before while `fn()` ran, in bytes; None
    where Linux's peak counter cannot be reset (other systems, or a kernel that forbids it)."""
    _give_back_free_heap()
    before = resident_bytes()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    except OSError:
        return None
    fn()
    peak = resident_bytes("VmHWM")
    return None if before is None or peak is None else max(0, peak - before)


def bytes_per_image(embed_arrays: Callable[[np.ndarray], np.ndarray], shape: tuple[int, ...]) -> int:
    """One image's share of an inference batch's peak memory (inputs, activations, outputs), measured on a
    probe batch of PROBE images of `shape` (C x H x W) after a warm-up image."""
    probe = np.zeros((PROBE, *shape), np.float32)
    embed_arrays(probe[:1])  # weights packed, kernels chosen: those stay, whatever the batch
    peak = peak_of(lambda: embed_arrays(probe))
    if peak is None:
        return UNMEASURED_FACTOR * probe[0].nbytes
    return max(peak // PROBE, probe[0].nbytes)


def batch_within(memory: int, embed_arrays: Callable[[np.ndarray], np.ndarray], shape: tuple[int, ...], *,
                 most: int = MAX_BATCH, per_image: int | None = None) -> int:
    """The largest batch (1 to `most`) whose inference, with the HELD_BATCHES preprocessed batches beside it,
    keeps this process's resident memory within `memory` bytes, from what it holds now (`per_image`: an earlier
    `bytes_per_image` of the same model, else measured now)."""
    image = int(np.prod(shape)) * 4
    per_image = (bytes_per_image(embed_arrays, shape) if per_image is None else per_image) + HELD_BATCHES * image
    free = SAFE_SHARE * memory - (resident_bytes() or 0)
    return int(min(most, max(1, free // per_image)))

