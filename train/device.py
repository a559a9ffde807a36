"""Run-time device and mixed-precision selection: CUDA when present, CPU otherwise."""

from __future__ import annotations

import torch

from metricsearch.models.device import check_device


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


def memory_format(device: torch.device, setting: str | bool = "auto") -> torch.memory_format:
    """The layout of the weights and batches: channels-last where asked (`auto`: on CUDA only), else contiguous."""
    if setting not in ("auto", True, False):
        raise ValueError(f"channels_last must be auto, true or false, got {setting!r}")
    if setting is True or (setting == "auto" and device.type == "cuda"):
        return torch.channels_last
    return torch.contiguous_format


def amp_dtype(device: torch.device, setting: str = "auto") -> torch.dtype | None:
    """The autocast dtype: bf16 where the GPU supports it, else fp16; None (full precision) on CPU."""
    if setting not in ("auto", "off", "bf16", "fp16"):
        raise ValueError(f"amp must be auto, off, bf16 or fp16, got {setting!r}")
    if setting == "off" or (setting == "auto" and device.type != "cuda"):
        return None
    if setting == "fp16":
        return torch.float16
    if setting == "bf16":
        return torch.bfloat16
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
