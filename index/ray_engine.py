"""`RayEngine`: the reading and embedding stages of the pipeline on a Ray cluster.

    positions --map_batches(ImageReader, tasks)--> read items + pixels
              --map_batches(RayEmbedder, actor pool: one per GPU, or CPU actors)--> + embeddings
              --iter_batches (in order)--> the gallery's single LMDB writer, here in the driver

Only the two stages move: which images to read (resume), duplicates (the writer keeps the first
of identical images, in order), failures and the report are the jobs' code. Ray is
imported inside the functions, so `metricsearch.index` works without the `scale` extra.
The faiss index is built once every image is in: large IVF indexes in shards on the cluster (sharded_build.py).
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .pipeline import EmbedStep, ImageReader, ReadItem, StageTimes, WriteFn, write_batches

log = logging.getLogger("metricsearch.index")
READ_TASK_BASE_MEMORY = 192 << 20  # a worker process with numpy, PIL and onnxruntime loaded
_TEXT = ("status", "source", "label", "reason")
_BYTES = ("sha256", "thumbnail")


def import_ray():
    """The ray module, or ImportError saying which extra installs it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError("--engine ray needs Ray Data: pip install 'metricsearch[scale]' (ray[data])") from exc
    return ray


@contextmanager
def ray_session(address: str | None = None) -> Iterator[Any]:
    """Connected to Ray for the block: the running session when there is one, else the cluster at
    `address`, else a new local cluster; a cluster or connection opened here is closed after."""
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address or "local", include_dashboard=False, logging_level=logging.WARNING,
                 log_to_driver=False)
    elif address:
        log.info("ray: already connected, --ray-address %s is not used", address)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


class ReadBatch:
    """Stage 1 on Ray tasks: a batch of positions -> the ImageReader's items as columns, pixels
    zero where an image failed (shape `pixel_shape`)."""

    def __init__(self, reader: ImageReader, pixel_shape: tuple[int, ...]) -> None:
        self.reader, self.pixel_shape = reader, pixel_shape

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        items = [self.reader(int(p)) for p in batch["position"]]
        out: dict[str, np.ndarray] = {"position": np.array([it.position for it in items], np.int64)}
        for name in _TEXT + _BYTES:
            out[name] = np.array([getattr(it, name) for it in items], dtype=object)
        out["size"] = np.array([it.size for it in items], np.int64)
        out["seconds"] = np.array([it.seconds for it in items], np.float64)
        out["pixels"] = np.stack([it.pixels if it.pixels is not None else np.zeros(self.pixel_shape, np.float32)
                                  for it in items]).astype(np.float32, copy=False)
        return out


class RayEmbedder:
    """Stage 2 on a Ray actor: the model (sent as bytes, so that no worker needs the driver's files)
    in an EmbedStep; embeds the rows read ok, drops the pixels, adds the seconds it took."""

    def __init__(self, model_bytes: bytes, device: str = "auto") -> None:
        folder = Path(tempfile.mkdtemp(prefix="metricsearch-ray-"))
        path = folder / f"{hashlib.sha256(model_bytes).hexdigest()[:16]}.onnx"
        path.write_bytes(model_bytes)
        self.step = EmbedStep(path, device)
        self.dim = self.step.embedder.dim

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        pixels = batch.pop("pixels")
        ok = np.array([s == "ok" for s in batch["status"]], bool)
        embedding = np.zeros((len(ok), self.dim), np.float32)
        if ok.any():
            embedding[ok] = self.step({"pixels": pixels[ok]})["embedding"]
        batch["embedding"] = embedding
        batch["embed_seconds"] = np.full(len(ok), (time.perf_counter() - start) / max(len(ok), 1))
        return batch


def _items(batch: dict[str, np.ndarray]) -> tuple[list[ReadItem], np.ndarray | None]:
    """ReadItems (no pixels) and the embeddings of the ok ones, from a batch of result columns."""
    items = []
    for r in range(len(batch["position"])):
        def text(name: str) -> Any:
            value = batch[name][r]
            return None if value is None or (name == "label" and value != value) else str(value)

        items.append(ReadItem(int(batch["position"][r]), text("source"), text("label"), text("status"),
                              bytes(batch["sha256"][r] or b""), int(batch["size"][r]), None,
                              bytes(batch["thumbnail"][r] or b""), text("reason") or "", float(batch["seconds"][r])))
    ok = np.array([it.status == "ok" for it in items], bool)
    return items, (np.ascontiguousarray(batch["embedding"][ok], np.float32) if ok.any() else None)


def cluster_actors(resources: dict, device: str = "auto", actors: int | None = None) -> tuple[int, dict]:
    """How many embedding actors and what each takes: one per GPU of the cluster (a GPU each), else
    CPU actors (one CPU each; by default half the cluster's CPUs, the rest read images)."""
    gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 1))
    if gpus > 0 and device != "cpu":
        return actors or gpus, {"num_gpus": 1}
    return actors or max(1, cpus // 2), {"num_cpus": 1}


class RayEngine:
    """Runs the reading and embedding stages on Ray (the cluster at `address`, a new local one without):
    reading on tasks, the ONNX `model` on `actors` embedding actors (default one per GPU, else half
    the CPUs); the batches come back in order to the writer here."""

    name = "ray"

    def __init__(self, model: str | Path, device: str = "auto", address: str | None = None,
                 actors: int | None = None) -> None:
        self.model, self.device, self.address, self.actors = Path(model), device, address, actors

    def run(self, reader: ImageReader, positions: list[int], write: WriteFn, *, batch_size: int = 256,
            progress: bool = False, desc: str = "indexing") -> StageTimes:
        """Read and embed the images at `positions` on Ray, and `write` the batches in order here."""
        times = StageTimes(items=len(positions))
        if not positions:
            return times
        with ray_session(self.address) as ray:
            ds = self._dataset(ray, reader, positions, batch_size, progress)
            write_batches(_batches(ds, batch_size, times), write, times)
        return times

    def _dataset(self, ray: Any, read: ImageReader, positions: list[int], batch_size: int, progress: bool) -> Any:
        import ray.data

        prep = read.preprocessing
        shape = (prep.channels, prep.size, prep.size)
        # without `committed` (an LMDB handle of this process): the writer finds committed duplicates
        read = ImageReader(read.images, read.sources, prep, read.settings)
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True  # the first of identical images is kept, as locally
        context.enable_progress_bars = progress
        if not progress:
            logging.getLogger("ray.data").setLevel(logging.WARNING)
        count, per_actor = cluster_actors(ray.cluster_resources(), self.device, self.actors)
        log.info("ray: %d embedding actor(s), each with %s", count, per_actor)
        blocks = max(1, min(len(positions) // max(1, batch_size), 4 * int(ray.cluster_resources().get("CPU", 1))))
        ds = ray.data.from_items([{"position": p} for p in positions], override_num_blocks=blocks)
        # reading on tasks, each reserving the memory of its batch (pixels, thumbnails, a decoded image);
        # that reservation also keeps Ray Data from fusing them into the embedding actors
        side = max(read.settings.thumbnail_size, prep.size)
        memory = batch_size * (4 * int(np.prod(shape)) + 3 * side * side) + READ_TASK_BASE_MEMORY
        ds = ds.map_batches(ReadBatch(read, shape), batch_size=batch_size, num_cpus=1, memory=memory)
        return ds.map_batches(RayEmbedder, fn_constructor_kwargs={"model_bytes": self.model.read_bytes(),
                                                                  "device": self.device},
                              batch_size=batch_size, compute=ray.data.ActorPoolStrategy(size=count), **per_actor)


def _batches(ds: Any, batch_size: int, times: StageTimes) -> Iterator[tuple[list[ReadItem], np.ndarray | None]]:
    """The dataset's batches in order as (items, embeddings), adding their read and embed seconds to `times`."""
    for batch in ds.iter_batches(batch_size=batch_size, batch_format="numpy", prefetch_batches=1):
        items, vectors = _items(batch)
        times.read += sum(it.seconds for it in items)
        times.embed += float(np.sum(batch["embed_seconds"]))
        yield items, vectors
