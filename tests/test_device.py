"""Run-time selection of CUDA / CPU for training, mixed precision and onnxruntime providers."""

from __future__ import annotations

import math

import pytest
import torch

from metricsearch.models.onnx_embedder import select_providers
from metricsearch.train.device import amp_dtype, resolve_device


def test_auto_device_follows_cuda_availability() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu").type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_cuda_without_gpu_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no CUDA GPU"):
        resolve_device("cuda")


def test_unknown_device_is_rejected() -> None:
    with pytest.raises(ValueError, match="auto, cpu or cuda"):
        resolve_device("tpu")


def test_amp_is_off_on_cpu_and_explicit_choices_win() -> None:
    cpu = torch.device("cpu")
    assert amp_dtype(cpu, "auto") is None
    assert amp_dtype(cpu, "off") is None
    assert amp_dtype(cpu, "bf16") is torch.bfloat16
    assert amp_dtype(torch.device("cuda"), "fp16") is torch.float16
    assert amp_dtype(torch.device("cuda"), "off") is None
    with pytest.raises(ValueError, match="amp"):
        amp_dtype(cpu, "fp8")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_amp_auto_on_cuda_prefers_bf16() -> None:
    expected = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    assert amp_dtype(torch.device("cuda"), "auto") is expected


def test_onnx_providers_prefer_cuda_when_present_and_fall_back_to_cpu() -> None:
    both = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert select_providers(both, "auto") == both
    assert select_providers(both, "cpu") == ["CPUExecutionProvider"]
    assert select_providers(["CPUExecutionProvider"], "auto") == ["CPUExecutionProvider"]
    with pytest.raises(ValueError, match="CUDAExecutionProvider"):
        select_providers(["CPUExecutionProvider"], "cuda")


def test_cpu_bf16_training_step_is_finite(tmp_path) -> None:
    from metricsearch.train.config import load_config
    from metricsearch.train.trainer import train

    config = load_config(None, [f"output_dir={tmp_path}", "epochs=1", "batches_per_epoch=2", "amp=bf16",
                                "eval.nmi=false", "model.dim=16"])
    result = train(config, progress=False)
    assert math.isfinite(result.last_metrics["loss"])
