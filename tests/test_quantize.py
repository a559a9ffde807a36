"""`metricsearch quantize`: an int8 copy of an exported model, calibrated on real images, close to the float32 one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from metricsearch.app.cli import main
from metricsearch.data import load_image_set
from metricsearch.evaluation import evaluate
from metricsearch.models import OnnxEmbedder
from metricsearch.models.onnx_embedder import cpu_flags, int8_problem
from metricsearch.train import export_onnx, quantize_onnx
from metricsearch.train.config import load_config
from metricsearch.train.export import ExportError
from metricsearch.train.trainer import train


def test_the_int8_model_keeps_the_metadata_and_the_neighbours(digits_onnx: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "digits8.onnx"
    assert main(["quantize", str(digits_onnx), "--out", str(out), "--images", "digits", "--count", "128"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["onnx"] == str(out) and printed["calibration_images"] == 128
    ops = {node.op_type for node in onnx.load(str(out)).graph.node}
    assert "QLinearConv" in ops and "Conv" not in ops, ops  # the convolutions really run in int8
    fp32, int8 = OnnxEmbedder(digits_onnx, device="cpu"), OnnxEmbedder(out, device="cpu")
    assert int8.preprocessing == fp32.preprocessing and int8.dim == fp32.dim
    assert int8.metadata["quantized"] == "int8 (7-bit weights), calibrated on 128 images of digits"
    test = load_image_set("digits", "test")
    a, b = fp32.embed_set(test), int8.embed_set(test)
    cosines = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cosines.min() >= printed["min_cosine"] - 0.05 and printed["min_cosine"] >= 0.9
    r1_fp32 = evaluate(a, test.labels, recall_k=(1,), with_nmi=False)["recall_at_k"][1]
    r1_int8 = evaluate(b, test.labels, recall_k=(1,), with_nmi=False)["recall_at_k"][1]
    assert r1_int8 >= r1_fp32 - 0.02, (r1_int8, r1_fp32)


def _conv_weights(path: Path) -> list[np.ndarray]:
    """The int8 weight tensors of a quantised graph's convolutions."""
    graph = onnx.load(str(path)).graph
    tensors = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    return [tensors[node.input[3]] for node in graph.node if node.op_type == "QLinearConv"]


def test_the_weights_keep_to_7_bits_unless_full_range_is_asked(digits_onnx: Path, tmp_path: Path, caplog) -> None:
    # 7 bits: onnxruntime's uint8 x int8 pair sums fit 16 bits on CPUs without VNNI, where 8 bits saturate
    quantize_onnx(digits_onnx, tmp_path / "7.onnx", "digits", count=32)
    assert main(["quantize", str(digits_onnx), "--out", str(tmp_path / "8.onnx"), "--images", "digits", "--count",
                 "32", "--full-range"]) == 0
    seven, eight = _conv_weights(tmp_path / "7.onnx"), _conv_weights(tmp_path / "8.onnx")
    assert seven and all(w.dtype == np.int8 for w in seven + eight)
    assert max(int(np.abs(w.astype(int)).max()) for w in seven) <= 64
    assert max(int(np.abs(w.astype(int)).max()) for w in eight) == 127
    OnnxEmbedder(tmp_path / "7.onnx", device="cpu")  # neither it nor the quantiser's checks warn of VNNI
    assert "VNNI" not in caplog.text
    assert OnnxEmbedder(tmp_path / "8.onnx", device="cpu").metadata["quantized"].startswith("int8 (8-bit weights)")
    # loading the 8-bit copy warns on an x86 CPU without VNNI (as /proc/cpuinfo lists it), only there
    assert (f"{tmp_path / '8.onnx'}: it is an int8 copy with 8-bit weights" in caplog.text) == _lacks_vnni(), \
        caplog.text


def _lacks_vnni() -> bool:
    """Whether this machine's /proc/cpuinfo lists an x86 CPU without VNNI."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    return " sse2 " in cpuinfo and not re.search(r"\b(avx512_vnni|avx_vnni|amx_int8)\b", cpuinfo)


X86_AVX2 = frozenset("fpu sse sse2 avx avx2 fma".split())


@pytest.mark.parametrize("quantized, flags, warns", [
    ("int8 (8-bit weights), calibrated on 32 images of digits", X86_AVX2, True),
    ("int8, calibrated on 256 images of omniglot", X86_AVX2, True),  # a copy made before 7 bits were the default
    ("int8 (7-bit weights), calibrated on 32 images of digits", X86_AVX2, False),
    ("int8 (8-bit weights), calibrated on 32 images of digits", X86_AVX2 | {"avx512_vnni"}, False),
    ("int8 (8-bit weights), calibrated on 32 images of digits", X86_AVX2 | {"avx_vnni"}, False),
    ("int8 (8-bit weights), calibrated on 32 images of digits", frozenset({"fp", "asimd", "asimddp"}), False),  # Arm
    ("int8 (8-bit weights), calibrated on 32 images of digits", None, False),  # flags unknown: no guess
    (None, X86_AVX2, False),  # a float32 model
])
def test_an_8_bit_copy_is_flagged_only_on_x86_without_vnni(quantized, flags, warns) -> None:
    assert (int8_problem(quantized, flags) is not None) == warns


def test_cpu_flags_are_read_from_a_cpuinfo_file(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 fma\n\n"
                       "processor\t: 1\nflags\t\t: fpu sse2 avx2 fma\n")
    assert cpu_flags(cpuinfo) == {"fpu", "sse2", "avx2", "fma"}
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm\n")  # Arm's name for the line
    assert cpu_flags(cpuinfo) == {"fp", "asimd", "evtstrm"}
    assert cpu_flags(tmp_path / "absent") is None


def test_a_model_that_strays_writes_nothing(digits_onnx: Path, tmp_path: Path) -> None:
    out = tmp_path / "digits8.onnx"
    with pytest.raises(ExportError, match="strays from the float32 one") as refused:
        quantize_onnx(digits_onnx, out, "digits", count=32, min_cosine=1.01)
    assert "VNNI" not in str(refused.value)  # 7-bit weights: the CPU plays no part
    with pytest.raises(ExportError, match="strays from the float32 one") as refused:
        quantize_onnx(digits_onnx, out, "digits", count=32, min_cosine=1.01, full_range=True)
    # with 8-bit weights it says whether this CPU lacks VNNI, as /proc/cpuinfo tells
    assert ("--full-range: this CPU has no VNNI" in str(refused.value)) == _lacks_vnni(), refused.value
    assert not out.exists()
    out.write_bytes(b"keep")
    assert main(["quantize", str(digits_onnx), "--out", str(out), "--images", "digits"]) == 2
    assert out.read_bytes() == b"keep"


def test_a_pool_first_cnn_quantizes_close_to_its_float32_model(tmp_path: Path) -> None:
    # conv-pool-BN-ReLU (configs/omniglot.yaml's blocks): the batch norm is not folded into the convolution
    config = load_config("digits", [f"output_dir={tmp_path}", "epochs=1", "model.backbone_params.pool_first=true"])
    onnx_path = export_onnx(train(config, progress=False).run_dir, tmp_path / "first.onnx").path
    report = quantize_onnx(onnx_path, tmp_path / "first8.onnx", "digits", count=64)
    ops = {node.op_type for node in onnx.load(str(tmp_path / "first8.onnx")).graph.node}
    assert "QLinearConv" in ops and "Conv" not in ops, ops
    assert report.min_cosine >= 0.97, report  # well above the 0.9 that quantize_onnx itself demands
