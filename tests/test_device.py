"""Run-time selection of CUDA / CPU for training, mixed precision and onnxruntime providers."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from metricsearch.models.onnx_embedder import cuda_fallback_notice, cuda_provider_problem, select_providers
from metricsearch.train.device import amp_dtype, resolve_device, tensor_layout


def test_auto_device_follows_cuda_availability() -> None:
    assert resolve_device("auto", cuda_available=True).type == "cuda"
    assert resolve_device("auto", cuda_available=False).type == "cpu"
    assert resolve_device("cpu", cuda_available=True).type == "cpu"
    assert resolve_device("cuda:1", cuda_available=True) == torch.device("cuda", 1)
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")  # this machine


def test_cuda_without_gpu_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no CUDA GPU"):
        resolve_device("cuda", cuda_available=False)


def test_unknown_device_is_rejected() -> None:
    with pytest.raises(ValueError, match="auto, cpu, cuda or cuda:N"):
        resolve_device("tpu")


def test_amp_is_off_on_cpu_and_explicit_choices_win() -> None:
    cpu = torch.device("cpu")
    assert amp_dtype(cpu, "auto") is None
    assert amp_dtype(cpu, "off") is None
    assert amp_dtype(cpu, "bf16", cpu_bf16=True) is torch.bfloat16
    assert amp_dtype(torch.device("cuda"), "fp16") is torch.float16
    assert amp_dtype(torch.device("cuda"), "off") is None
    with pytest.raises(ValueError, match="amp"):
        amp_dtype(cpu, "fp8")


def test_amp_bf16_falls_back_to_float32_on_a_cpu_without_bf16_instructions(caplog) -> None:
    assert amp_dtype(torch.device("cpu"), "bf16", cpu_bf16=False) is None
    assert "training in float32" in caplog.text and "AVX512-BF16" in caplog.text
    assert amp_dtype(torch.device("cuda"), "bf16", cpu_bf16=False) is torch.bfloat16  # the GPU decides there


@pytest.mark.parametrize("limit", ["AVX2", "AVX512_CORE"])
def test_bf16_detection_follows_onednns_isa_limit_and_the_trainer_falls_back(limit) -> None:
    probe = ("from metricsearch.train.device import cpu_has_native_bf16; "
             "from metricsearch.train.config import load_config, typed_config; "
             "from metricsearch.train.trainer import build_setup; "
             "s = build_setup(typed_config(load_config(None, ['amp=bf16', 'model.dim=16', 'device=cpu']))); "
             "print(cpu_has_native_bf16(), s.autocast)")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": limit}  # the oneDNN of a CPU without bf16 instructions
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "None"], out.stdout
    assert "training in float32" in out.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_amp_auto_on_cuda_prefers_bf16() -> None:
    expected = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    assert amp_dtype(torch.device("cuda"), "auto") is expected


def test_channels_last_is_on_for_cuda_and_where_asked() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert tensor_layout(cuda, "auto") is torch.channels_last
    assert tensor_layout(cpu, "auto") is torch.contiguous_format
    assert tensor_layout(cpu, True) is torch.channels_last
    assert tensor_layout(cuda, False) is torch.contiguous_format
    with pytest.raises(ValueError, match="channels_last"):
        tensor_layout(cpu, "yes")


def test_the_trainer_lays_the_model_out_as_the_config_says() -> None:
    from metricsearch.train.config import load_config, typed_config
    from metricsearch.train.trainer import build_setup

    for setting, layout in ((True, torch.channels_last), (False, torch.contiguous_format)):
        setup = build_setup(typed_config(load_config(None, ["model.dim=16", f"channels_last={setting}"])))
        conv = next(m for m in setup.model.modules() if isinstance(m, torch.nn.Conv2d))
        assert setup.layout is layout and conv.weight.is_contiguous(memory_format=layout)


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


def _shared_library(folder: Path, name: str, needs: str | None = None) -> Path:
    """A real shared library built with the C compiler; with `needs`, it calls into lib`needs`.so in `folder`."""
    source = folder / f"{name}.c"
    if needs:
        source.write_text("int metricsearch_probe(void);\n"
                          "int metricsearch_call(void) { return metricsearch_probe(); }\n")
    else:
        source.write_text("int metricsearch_probe(void) { return 1; }\n")
    link = ["-L", str(folder), f"-l{needs}"] if needs else []
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(folder / name), str(source), *link], check=True)
    return folder / name


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build a provider library")
def test_a_cuda_provider_that_cannot_load_names_the_missing_library(tmp_path) -> None:
    capi = tmp_path / "capi"
    capi.mkdir()
    assert "CPU build" in cuda_provider_problem(capi)  # no provider library at all
    _shared_library(capi, "libcudart_probe.so")
    _shared_library(capi, "libonnxruntime_providers_cuda.so", needs="cudart_probe")
    (capi / "libcudart_probe.so").unlink()  # as when a CUDA library is missing from the machine
    problem = cuda_provider_problem(capi)
    assert "libcudart_probe.so" in problem
    assert problem in cuda_fallback_notice("auto", problem)
    with pytest.raises(ValueError, match="libcudart_probe.so"):
        cuda_fallback_notice("cuda", problem)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build a provider library")
def test_a_loadable_cuda_provider_is_no_problem(tmp_path) -> None:
    _shared_library(tmp_path, "libonnxruntime_providers_cuda.so")
    assert cuda_provider_problem(tmp_path) is None


def test_the_cpu_build_of_onnxruntime_is_diagnosed_as_such() -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has onnxruntime's GPU build")
    assert "CPU build" in cuda_provider_problem()
