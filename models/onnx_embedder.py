"""The exported embedder at run time: onnxruntime (CUDA provider when present) plus its preprocessing."""

from __future__ import annotations

import ctypes
import json
import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from metricsearch.models.base import ArrayEmbedder
from metricsearch.models.device import check_device
from metricsearch.models.memory_budget import MAX_BATCH_GPU
from metricsearch.models.preprocessing import Preprocessing

METADATA_PREFIX = "metricsearch."
CUDA_PROVIDER = "CUDAExecutionProvider"
log = logging.getLogger("metricsearch.models")


def select_providers(available: Sequence[str], device: str = "auto") -> list[str]:
    """onnxruntime providers for `device` (auto|cpu|cuda) given the available ones, CPU always last."""
    check_device(device, indexed=False)
    if device == "cuda" and "CUDAExecutionProvider" not in available:
        raise ValueError(
            "device 'cuda' was asked for but onnxruntime has no CUDAExecutionProvider "
            f"(available: {', '.join(available)}); install the `gpu` extra or use --device cpu"
        )
    if device != "cpu" and "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def cuda_provider_problem(capi_dir: str | Path | None = None) -> str | None:
    """Why onnxruntime's CUDA provider library cannot load here (the missing file it names), or None if it loads."""
    if capi_dir is None:
        import onnxruntime as ort

        capi_dir = Path(ort.__file__).parent / "capi"
    library = Path(capi_dir) / "libonnxruntime_providers_cuda.so"
    if not library.is_file():
        return f"{library.name} is not installed (this is the CPU build of onnxruntime)"
    try:
        ctypes.CDLL(str(library))
    except OSError as exc:
        return str(exc)
    return None


def cuda_fallback_notice(device: str, problem: str | None) -> str:
    """The one line said when onnxruntime fell back from the CUDA provider to the CPU; a ValueError instead when
    `device` is cuda (asked for explicitly)."""
    why = problem or "onnxruntime dropped it when it created the session"
    if device == "cuda":
        raise ValueError(f"device 'cuda' was asked for but onnxruntime's CUDA provider is not usable: {why}")
    return f"onnxruntime's CUDA provider is installed but not usable, so the model runs on the CPU: {why}"


#: /proc/cpuinfo flags of the x86 instructions that sum int8 products in 32 bits (VNNI; AMX CPUs have them too)
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str] | None:
    """The first CPU's feature flags as Linux lists them, or None where they cannot be read (not Linux)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def int8_problem(quantized: str | None, flags: frozenset[str] | None) -> str | None:
    """Why an int8 copy (its `quantized` metadata) may embed wrongly on a CPU with these flags, or None: 8-bit
    weights saturate onnxruntime's 16-bit pair sums on x86 CPUs without VNNI."""
    if not quantized or "7-bit" in quantized or flags is None or "sse2" not in flags or VNNI_FLAGS & flags:
        return None
    return ("it is an int8 copy with 8-bit weights and this CPU has no VNNI, where onnxruntime's int8 sums "
            "saturate: its embeddings may be wrong; make the copy again with `metricsearch quantize` (7-bit "
            "weights unless --full-range)")


class OnnxEmbedder(ArrayEmbedder):
    """Embeds PIL images or preprocessed arrays with an exported metricsearch ONNX model.

    `arena=False` turns onnxruntime's CPU memory arena off: each batch's activations go back to the system
    after it, instead of staying as the arena's high-water mark (a batch job's memory, half of it for a
    photo model; a server keeps the arena, which saves allocations per request)."""

    def __init__(self, path: str | Path, device: str = "auto", *, arena: bool = True) -> None:
        import onnxruntime as ort

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"ONNX model {self.path} does not exist (make one with `metricsearch export`)")
        providers = select_providers(ort.get_available_providers(), device)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.enable_cpu_mem_arena = arena
        # Idle inference threads sleep instead of spinning: on a shared CPU, spinning threads starve the
        # faiss search (and request threads) that follow each call; a one-query search took 10x longer.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(str(self.path), options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types for bad files
            raise ValueError(f"{self.path} is not a loadable ONNX model: {exc}") from exc
        meta = self.session.get_modelmeta().custom_metadata_map
        if METADATA_PREFIX + "preprocessing" not in meta:
            raise ValueError(f"{self.path} has no metricsearch metadata: export it with `metricsearch export`")
        self.metadata = {k[len(METADATA_PREFIX):]: v for k, v in meta.items() if k.startswith(METADATA_PREFIX)}
        self.preprocessing = Preprocessing.from_json(self.metadata["preprocessing"])
        self.dim = int(self.metadata["embedding_dim"])
        self.normalized = json.loads(self.metadata.get("normalized", "true"))
        self.input_name = self.session.get_inputs()[0].name
        self.providers = self.session.get_providers()
        if self.providers[0] == CUDA_PROVIDER:
            self.largest_batch = MAX_BATCH_GPU
        if CUDA_PROVIDER in providers and CUDA_PROVIDER not in self.providers:
            log.warning(cuda_fallback_notice(device, cuda_provider_problem()))
        quantized = self.metadata.get("quantized")  # /proc/cpuinfo is read for int8 copies only
        if quantized and self.providers[0] != CUDA_PROVIDER and (problem := int8_problem(quantized, cpu_flags())):
            log.warning(f"{self.path}: {problem}")

    def embed_arrays(self, batch: np.ndarray) -> np.ndarray:
        """Embeddings (N x dim float32) of preprocessed images (N x C x H x W float32)."""
        batch = np.ascontiguousarray(batch, dtype=np.float32)
        return self.session.run(None, {self.input_name: batch})[0]
