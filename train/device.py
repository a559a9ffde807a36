"""Run-time device and mixed-precision selection: CUDA when present, CPU otherwise."""

from __future__ import annotations

import logging
import os
import platform
from typing import Any

import torch

from metricsearch.models.device import check_device
from metricsearch.train.deprecated_aliases import renamed_attribute

log = logging.getLogger("metricsearch.train")


def resolve_device(name: str = "auto", cuda_available: bool | None = None) -> torch.device:
    """`auto` -> cuda if available else cpu; `cuda` without a GPU is an error that says so."""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if name == "auto":
        return torch.device("cuda" if cuda_available else "cpu")
    check_device(name)
    if name.startswith("cuda") and not cuda_available:
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA GPU; use --device cpu or auto")
    return torch.device(name)


def tensor_layout(device: torch.device, setting: str | bool = "auto") -> torch.memory_format:
    """The layout of the weights and batches: channels-last where asked (`auto`: on CUDA only), else contiguous."""
    if setting not in ("auto", True, False):
        raise ValueError(f"channels_last must be auto, true or false, got {setting!r}")
    if setting is True or (setting == "auto" and device.type == "cuda"):
        return torch.channels_last
    return torch.contiguous_format


#: oneDNN's x86 ISA limits (ONEDNN_MAX_CPU_ISA) below the bf16 instructions: bf16 is emulated under them
_NO_BF16_ISAS = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN computes bfloat16 in hardware on this CPU (on x86: AVX512-BF16 or AMX), not emulated."""
    limit = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    if limit in _NO_BF16_ISAS or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return True
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def amp_dtype(device: torch.device, setting: str = "auto", cpu_bf16: bool | None = None) -> torch.dtype | None:
    """The autocast dtype: bf16 where the GPU supports it, else fp16; None (full precision) on CPU. `bf16` on a
    CPU without bfloat16 in hardware (`cpu_bf16`, detected when None) falls back to full precision, with a warning."""
    if setting not in ("auto", "off", "bf16", "fp16"):
        raise ValueError(f"amp must be auto, off, bf16 or fp16, got {setting!r}")
    if setting == "off" or (setting == "auto" and device.type != "cuda"):
        return None
    if setting == "fp16":
        return torch.float16
    if setting == "bf16":
        if device.type == "cpu" and not (cpu_has_native_bf16() if cpu_bf16 is None else cpu_bf16):
            log.warning("amp: bf16 asked for, but this CPU has no bfloat16 instructions (AVX512-BF16 or AMX), where "
                        "bf16 steps run 2-11x slower than float32: training in float32 (bench/results/train_amp.md)")
            return None
        return torch.bfloat16
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def __getattr__(name: str) -> Any:
    """Deprecated names: `memory_format` is now `tensor_layout` (goes in the next release)."""
    return renamed_attribute(__name__, name, {"memory_format": f"{__name__}.tensor_layout"})
