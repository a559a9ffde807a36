"""Int8 copies of exported ONNX embedders: static quantisation calibrated on real images, checked against float32."""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from metricsearch.data import ImageSet, load_image_set
from metricsearch.models.onnx_embedder import OnnxEmbedder, cpu_flags, int8_problem
from metricsearch.train.export import ExportError, add_metadata, check_out
from metricsearch.train.checkpoint_data import sample_batch


@dataclass
class QuantizeReport:
    """Where the int8 model went and how closely its embeddings follow the float32 model's."""

    path: Path
    calibration_images: int
    min_cosine: float
    mean_cosine: float


def quantize_onnx(model: str | Path, out: str | Path, images: str | ImageSet, *, count: int = 256,
                  min_cosine: float = 0.9, full_range: bool = False, overwrite: bool = False) -> QuantizeReport:
    """Write an int8 copy of an exported model to `out`: int8 weights (per channel) and activations, their
    ranges calibrated on `count` images of `images` (a spec or an ImageSet), the metadata kept; ExportError
    (and nothing written) when an image's int8 embedding has a cosine below `min_cosine` to its float32 one.

    The weights use 7 bits unless `full_range`: onnxruntime multiplies uint8 activations by int8 weights in
    pairs summed into 16 bits on x86 CPUs without VNNI (AVX2, AVX-512 before VNNI), and full-range weights
    saturate those sums there, whatever CPU the copy was made on (an Omniglot CNN's cosine fell to -0.21 on
    an AVX2 AMD EPYC; 0.991 with 7 bits)."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    out = check_out(out, overwrite)
    source = OnnxEmbedder(model, device="cpu")
    image_set = images if isinstance(images, ImageSet) else load_image_set(images)
    batch = sample_batch(source.preprocessing, image_set, count)
    what = images if isinstance(images, str) else "an image set"
    name = source.input_name

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.chunks = iter(batch[i:i + 32] for i in range(0, len(batch), 32))

        def get_next(self) -> dict[str, np.ndarray] | None:
            chunk = next(self.chunks, None)
            return None if chunk is None else {name: chunk}

    with tempfile.TemporaryDirectory(prefix="metricsearch_quantize_") as tmp:
        prepared, quantized = Path(tmp) / "prepared.onnx", Path(tmp) / "int8.onnx"
        # the quantiser warns on the root logger for every int64 shape tensor, and an 8-bit copy's VNNI warning
        # would name the temporary file: the cosines below decide here
        logging.disable(logging.WARNING)
        try:
            quant_pre_process(str(source.path), str(prepared), skip_symbolic_shape=True)
            quantize_static(str(prepared), str(quantized), Reader(), quant_format=QuantFormat.QOperator,
                            per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                            reduce_range=not full_range)
            proto = onnx.load(str(quantized))
            del proto.metadata_props[:]
            proto.metadata_props.extend(onnx.load(str(source.path)).metadata_props)
            bits = 8 if full_range else 7
            add_metadata(proto, {"quantized": f"int8 ({bits}-bit weights), calibrated on {len(batch)} images of "
                                              f"{what}"})
            onnx.save(proto, str(quantized))
            int8 = OnnxEmbedder(quantized, device="cpu")
        finally:
            logging.disable(logging.NOTSET)
        cosines = _cosines(source.embed_arrays(batch), int8.embed_arrays(batch))
        if cosines.min() < min_cosine:
            raise ExportError(f"the int8 model strays from the float32 one: an embedding's cosine to its float32 "
                              f"embedding is {cosines.min():.3f} < {min_cosine:g}; nothing written (keep the float32 "
                              f"model, or calibrate on other --images{_full_range_hint(int8) if full_range else ''})")
        shutil.move(quantized, out)
    return QuantizeReport(out, len(batch), float(cosines.min()), float(cosines.mean()))


def _full_range_hint(int8: OnnxEmbedder) -> str:
    """What a refused 8-bit copy's error adds about VNNI: this CPU lacks it, may, or nothing (has it, not x86)."""
    flags = cpu_flags()
    if flags is None:
        return ", or leave out --full-range: this CPU may lack VNNI"
    if int8_problem(int8.metadata.get("quantized"), flags):
        return ", or leave out --full-range: this CPU has no VNNI, where 8-bit weights saturate onnxruntime's sums"
    return ""


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two embedding matrices."""
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return (a * b).sum(axis=1)
