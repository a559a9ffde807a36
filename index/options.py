"""The options of the indexing jobs, every one documented: `IndexOptions` (how `add_images` reads and
embeds images) and `BuildOptions` (those, plus what `build_gallery` decides for a new gallery)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from metricsearch.data import DEFAULT_MAX_PIXELS
from metricsearch.models import OnnxEmbedder
from metricsearch.models.memory_budget import DEFAULT_MEMORY

from .engines import check_engine, make_engine
from .pipeline import MIN_SIDE, THUMBNAIL_SIZE, EmbedStep, Engine, ReadSettings


@dataclass(frozen=True)
class IndexOptions:
    """How images are read and embedded into a gallery (`add_images`, and `build_gallery`).

    part: only the `train` or `test` part of a split spec (--part); None: every image.
    batch_size: images per inference batch and per LMDB transaction (--batch); at least 1; None: the largest,
        at most 64 on a CPU and 256 on a GPU, that keeps the job within `memory` (measured on the model:
        models/memory_budget.py).
    memory: the job's budget of peak resident memory in bytes (--memory, in GB).
    workers: decoding threads of the local engine (--workers); None: one per core, at most 8.
    device: `auto` (CUDA for onnxruntime and a GPU for faiss when there), `cpu` or `cuda` (--device).
    progress: show a progress bar.
    embed_step: a callable from a batch {"pixels": N x C x H x W} to {"embedding": N x dim} used
        instead of the gallery's ONNX model (local engine only); None: the model, as `EmbedStep`.
    engine: where images are read and embedded (--engine): `local` threads here, or `ray` (a Ray
        cluster; needs the `scale` extra). The single LMDB writer runs here either way.
    ray_address: the Ray cluster of engine ray (--ray-address); None: start a local one.
    ray_actors: embedding actors of engine ray (--ray-actors); None: one per GPU of the cluster,
        else half its CPUs.
    """

    part: str | None = None
    batch_size: int | None = None
    memory: int = DEFAULT_MEMORY
    workers: int | None = None
    device: str = "auto"
    progress: bool = False
    embed_step: Callable[[dict], dict] | None = None
    engine: str = "local"
    ray_address: str | None = None
    ray_actors: int | None = None

    def __post_init__(self) -> None:
        if self.engine != "local" and self.embed_step is not None:
            raise ValueError("embed_step runs with the local engine only")
        check_engine(self.engine)
        for name, value in (("batch_size (--batch)", self.batch_size), ("workers (--workers)", self.workers),
                            ("ray_actors (--ray-actors)", self.ray_actors)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")

    def batch_for(self, embedder: OnnxEmbedder) -> int:
        """The batch size: `batch_size`, or the largest within `memory` for this embedder."""
        return self.batch_size or embedder.batch_within(self.memory)

    def make_engine(self, embedder: OnnxEmbedder, model: Path) -> Engine:
        """The engine these options name, embedding with `embedder` here or the ONNX file `model` on Ray."""
        return make_engine(self.engine, self.embed_step or EmbedStep(embedder), model, workers=self.workers,
                           device=self.device, ray_address=self.ray_address, ray_actors=self.ray_actors)


@dataclass(frozen=True)
class BuildOptions(IndexOptions):
    """`IndexOptions`, and what a new gallery is made with (`build_gallery`).

    index: the faiss index (--index): `auto` (the fastest measured candidate meeting recall@10 0.95,
        see `autoindex.build_index`), `flat`, `ivf`, `ivfpq`, `hnsw` or a faiss factory string; None:
        `auto`, or on resume the type asked for before.
    resume: continue an interrupted build where its committed work ends (--resume).
    overwrite: replace a gallery already in the folder (--overwrite).
    thumbnail_size: long side of the stored thumbnails in pixels (--thumbnail-size); 0: none.
    max_pixels: images with more pixels are refused (decompression bombs) (--max-pixels); None: no limit.
    min_side: images with a shorter side are refused (--min-side).
    ray_shards: with engine ray, an IVF index is added to in this many shards on Ray tasks and their inverted
        lists merged here (--ray-shards); None: one per CPU of a cluster of several machines from 1,000,000
        items, else none; 1: none (see sharded_build.py).
    index_memory: bytes the faiss index build may use (--index-memory, in GB); with `auto`, the index may take
        half, and compressed codes that re-rank with the stored vectors are chosen when no float index fits
        (see `autoindex.build_index`). None: the memory available when the index is built.
    """

    index: str | None = None
    resume: bool = False
    overwrite: bool = False
    thumbnail_size: int = THUMBNAIL_SIZE
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    min_side: int = MIN_SIDE
    ray_shards: int | None = None
    index_memory: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ray_shards is not None and self.ray_shards < 1:
            raise ValueError(f"ray_shards (--ray-shards) must be at least 1, got {self.ray_shards}")
        if self.ray_shards is not None and self.engine != "ray":
            raise ValueError("ray_shards (--ray-shards) shards the index on Ray: it needs engine ray (--engine ray)")
        if self.index_memory is not None and self.index_memory <= 0:
            raise ValueError(f"index_memory (--index-memory) must be positive, got {self.index_memory / 2**30:g} GB")

    def read_settings(self) -> ReadSettings:
        """How the reader treats images (checked: a bad limit is a ValueError naming its option)."""
        return ReadSettings(self.max_pixels, self.min_side, self.thumbnail_size)
