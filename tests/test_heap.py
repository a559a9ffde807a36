"""Freed memory kept in the heap while a CPU trains: when it is selected, and that glibc then maps no blocks."""

from __future__ import annotations

import ctypes
import math
import subprocess
import sys

import pytest
import torch

from metricsearch.train.glibc_heap import has_glibc, keep_heap

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


#: run in a fresh process, whose heap no earlier test has grown: how much glibc's separately mapped bytes
#: (mallinfo2's hblkhd) grow while a tensor of argv[1] bytes is alive, before, inside and after `kept_heap`,
#: and with it off
PROBE = """
import ctypes, sys, torch
from metricsearch.train.glibc_heap import kept_heap

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]

mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2

def mapped_while_held(nbytes):
    before = mallinfo2().hblkhd
    block = torch.empty(nbytes, dtype=torch.uint8)
    grown = mallinfo2().hblkhd - before
    del block
    return grown

size = int(sys.argv[1])
grown = [mapped_while_held(size)]
with kept_heap():
    grown.append(mapped_while_held(size))
grown.append(mapped_while_held(size))
with kept_heap(enabled=False):
    grown.append(mapped_while_held(size))
print(*grown)
"""


def test_the_heap_is_kept_on_a_cpu_with_glibc_and_where_asked() -> None:
    assert keep_heap(CPU, "auto", glibc=True)
    assert not keep_heap(CUDA, "auto", glibc=True)
    assert keep_heap(CUDA, True, glibc=True)
    assert not keep_heap(CPU, False, glibc=True)
    assert not keep_heap(CPU, "auto", glibc=False)
    assert not keep_heap(CPU, False, glibc=False)
    with pytest.raises(ValueError, match="keep_heap: true needs glibc"):
        keep_heap(CPU, True, glibc=False)
    with pytest.raises(ValueError, match="keep_heap must be auto, true or false"):
        keep_heap(CPU, "yes", glibc=True)


@pytest.mark.skipif(not has_glibc() or not hasattr(ctypes.CDLL(None), "mallinfo2"),
                    reason="needs glibc 2.33 or later (mallinfo2)")
def test_inside_kept_heap_large_tensors_are_not_mapped_and_afterwards_they_are_again() -> None:
    size = 64 << 20  # above glibc's largest mmap threshold (32 MB): mapped on its own by default
    done = subprocess.run([sys.executable, "-c", PROBE, str(size)], capture_output=True, text=True, check=True)
    before, inside, after, off = (int(x) for x in done.stdout.split())
    assert before >= size and inside == 0 and after >= size and off >= size


def test_keep_heap_may_change_when_a_run_resumes_and_other_values_are_refused(tmp_path) -> None:
    from metricsearch.train.config import load_config
    from metricsearch.train.trainer import train

    base = [f"output_dir={tmp_path}", "batches_per_epoch=2", "eval.nmi=false", "model.dim=16"]
    train(load_config(None, [*base, "epochs=2", "keep_heap=false"]), progress=False, stop_after_epoch=1)
    resumed = train(load_config(None, [*base, "epochs=2", "keep_heap=true"]), progress=False, resume=True)
    assert resumed.epochs == 2 and math.isfinite(resumed.last_metrics["loss"])
    with pytest.raises(ValueError, match="keep_heap"):
        load_config(None, [*base, "keep_heap=sometimes"])
