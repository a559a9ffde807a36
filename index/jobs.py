"""The indexing jobs behind `metricsearch index ...`: build (and resume), add, remove, rebuild.

Resume: every batch commits its items, embeddings, failures, counters and the sources it
consumed in one LMDB transaction; the faiss index is built from the committed embeddings once all
images are in, and saved beside the LMDB with the write version it reflects. After SIGKILL,
`--resume` skips every source the LMDB already holds (indexed, duplicate or failed), so nothing
is lost and nothing is embedded twice; a faiss file older than the LMDB is brought up to date
by replaying the change log.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from metricsearch.data import DEFAULT_MAX_PIXELS, ImageSet, load_image_set
from metricsearch.models import OnnxEmbedder

from .autoindex import build_index
from .faiss_files import save_index
from .faiss_index import INDEX_DIR, PQ_MIN, check_trainable, choose_index, describe, make_index, select_device
from .gallery import Gallery, check_model, file_sha256
from .layout import FORMAT_VERSION, LMDB_DIR, NotCreated, Store
from .locks import job_lock
from .pipeline import MIN_SIDE, THUMBNAIL_SIZE, EmbedStep, ImageReader, ReadSettings, StageTimes, run_pipeline, source_names
from .ray_engine import check_engine, run_ray_pipeline
from .steps import reached
from .writer import GalleryWriter, bump_version, record_job, start_job

log = logging.getLogger("metricsearch.index")
MODEL_FILE = "model.onnx"
REPORT_FILE = "report.json"


@dataclass
class JobSummary:
    """What a build or add did: counts of this job (across resumes), seconds per stage, the report file."""

    command: str
    db: str
    images: str
    indexed: int
    duplicates: int
    failed: int
    count: int
    seconds: dict
    images_per_s: float
    report: str
    device: dict
    index: dict | None = None
    resumed: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """Plain dict for JSON."""
        return asdict(self)


def build_faiss(store: Store, db: Path, request: str | None, faiss_device: str) -> dict:
    """Build, tune and save the faiss index of every committed embedding; mark the gallery ready."""
    with store.read() as txn:
        version, generation = store.version(txn), store.meta(txn, "generation", 0)
        model, request = store.meta(txn, "model"), request or store.meta(txn, "index_request", "auto")
        ids, vectors = store.vectors(txn)
    index, report = build_index(vectors, ids, index=request, device=faiss_device)
    log.info("faiss: %s for %d vectors (%s), built on %s", report["factory"], len(ids), report["reason"], faiss_device)
    info = describe(index)
    tuning = {k: report[k] for k in ("recall_at_10", "recall_at_10_lower", "target", "items") if k in report}
    header = {"version": version, "generation": generation + 1, "factory": report["factory"], "reason": report["reason"],
              "request": request, "params": report["params"], "tuning": tuning, "choice": report, "kind": info["kind"],
              "exact": info["exact"], "removable": info["removable"], "fingerprint": model["fingerprint"],
              "dim": int(model["dim"]), "count": len(ids), "built_on": faiss_device}
    save_index(db, index, header)
    reached("faiss_saved")

    def ready(txn) -> None:
        store.put_meta(txn, "index", {k: header[k] for k in ("factory", "reason", "request", "params", "tuning", "kind")})
        store.put_meta(txn, "index_request", request)
        store.put_meta(txn, "generation", generation + 1)
        store.put_meta(txn, "state", "ready")
        txn.drop(store.dbs["tombstones"], delete=False)
        store.prune_log(txn, version)
        bump_version(store, txn)

    store.write(ready)
    return header


@dataclass(frozen=True)
class Engine:
    """Where the reading and embedding stages run: `local` (threads here) or `ray` (a Ray cluster at
    `address`, a new local one without; `actors` embedding actors, default one per GPU or half the CPUs)."""

    name: str = "local"
    address: str | None = None
    actors: int | None = None

    def __post_init__(self) -> None:
        check_engine(self.name)


def _index_images(store: Store, image_set: ImageSet, images: str, split: str | None, embed: Callable[[dict], dict],
                  preprocessing, settings: ReadSettings, dim: int, *, resume: bool, batch_size: int,
                  workers: int | None, progress: bool, after_batch: Callable[[], None] | None = None,
                  engine: Engine = Engine(), model: Path | None = None, device: str = "auto") -> StageTimes:
    """Run reader -> embedder -> writer over `image_set`, loaded from spec `images` (on resume: the images
    not yet committed); with the ray engine, the reader and the embedder (`model`) run on the cluster."""
    sources = source_names(image_set, images, split)
    positions = list(range(len(sources)))
    if resume:  # skip what the interrupted job committed: indexed, duplicate or failed
        with store.read() as txn:
            positions = [i for i in positions if all(txn.get(sources[i].encode(), db=store.dbs[name]) is None
                                                     for name in ("sources", "failures"))]
    writer = GalleryWriter(store)
    reader = ImageReader(image_set, sources, preprocessing, replace(settings, mode=image_set.mode), writer.committed)

    def write(items, vectors) -> None:
        if vectors is not None and vectors.shape[1] != dim:
            raise ValueError(f"the embed step gave {vectors.shape[1]}-d vectors, the gallery holds {dim}-d ones")
        writer.write_batch(items, vectors)
        reached("batch")
        if after_batch is not None:
            after_batch()

    start = time.perf_counter()
    if engine.name == "ray":
        times = run_ray_pipeline(reader, positions, model, write, batch_size=batch_size, device=device,
                                 address=engine.address, actors=engine.actors, progress=progress)
    else:
        times = run_pipeline(reader, positions, embed, write, batch_size=batch_size, workers=workers,
                             progress=progress, desc=f"indexing {images}")
    times.total = time.perf_counter() - start
    return times


def _finish(store: Store, db: Path, times: StageTimes, pipeline_s: float, device: dict, notes: list[str]) -> JobSummary:
    """The job's summary, also written with every failure and its reason to DIR/report.json."""
    with store.read() as txn:
        job, index, count = store.meta(txn, "job"), store.meta(txn, "index"), store.count(txn)
        failures = [{"path": bytes(k).decode(), "reason": bytes(v).decode()} for k, v in txn.cursor(db=store.dbs["failures"])]
    seconds = times.to_dict()
    summary = JobSummary(job["command"], str(db), job["images"], job["indexed"], job["duplicates"], job["failed"],
                         count, seconds, round(times.items / pipeline_s, 1) if pipeline_s > 0 else 0.0,
                         str(db / REPORT_FILE), device, index, job.get("resumed", 0), notes)
    tmp = db / (REPORT_FILE + ".tmp")
    tmp.write_text(json.dumps({**summary.to_dict(), "failures": failures}, indent=1))
    os.replace(tmp, db / REPORT_FILE)
    return summary


def _existing(db: Path) -> bool:
    if not (db / LMDB_DIR / "data.mdb").is_file():
        return False
    try:
        store = Store.open(db)
    except NotCreated:  # a build stopped before its first commit: nothing to keep
        return False
    try:
        with store.read() as txn:
            return store.meta(txn, "format") is not None
    finally:
        store.close()


def _create(store: Store, db: Path, model: Path, embedder: OnnxEmbedder, settings: ReadSettings, request: str,
            images: str, split: str | None) -> None:
    """Copy the model into the gallery and write the metadata of a new gallery with its build job, in one commit."""
    make_index(choose_index(PQ_MIN, embedder.dim, request).factory, embedder.dim)  # a bad --index fails now
    tmp = db / (MODEL_FILE + ".tmp")
    shutil.copyfile(model, tmp)
    os.replace(tmp, db / MODEL_FILE)
    reached("model_copied")
    meta = {"fingerprint": file_sha256(db / MODEL_FILE), "dim": embedder.dim, "source": os.path.abspath(model),
            "file": MODEL_FILE, "preprocessing": embedder.preprocessing.to_dict(), "normalized": embedder.normalized}

    def fn(txn) -> None:
        for key, value in (("model", meta), ("settings", settings.to_dict()), ("index_request", request),
                           ("state", "building"), ("created", time.strftime("%Y-%m-%dT%H:%M:%S")),
                           ("generation", 0), ("next_id", 0), ("format", FORMAT_VERSION)):
            store.put_meta(txn, key, value)
        record_job(store, txn, "build", images, split, resume=False)

    store.write(fn)
    reached("created")


def build_gallery(
    model: str | Path, images: str, db: str | Path, *, split: str | None = None, batch_size: int = 256,
    workers: int | None = None, index: str | None = None, device: str = "auto", resume: bool = False,
    overwrite: bool = False, thumbnail_size: int = THUMBNAIL_SIZE, max_pixels: int | None = DEFAULT_MAX_PIXELS,
    min_side: int = MIN_SIDE, progress: bool = False, embed_step: Callable[[dict], dict] | None = None,
    engine: str = "local", ray_address: str | None = None, ray_actors: int | None = None,
) -> JobSummary:
    """Index every image of a data set spec (`split`: only its train or test part) into a new gallery
    folder `db` with the exported ONNX `model`; `resume` continues an interrupted build. `index`:
    auto (default), flat, ivf, ivfpq, hnsw or a faiss factory string. Unreadable images are skipped
    and listed in DIR/report.json; exact duplicates are stored once. `engine` ray reads and embeds
    on a Ray cluster (`ray_address`, or a new local one) with `ray_actors` embedding actors."""
    start, db, model = time.perf_counter(), Path(db), Path(model)
    run_on = _engine(engine, ray_address, ray_actors, embed_step)
    faiss_device = select_device(device)
    check_counts(batch_size, workers, ray_actors)
    settings = ReadSettings(max_pixels, min_side, thumbnail_size)
    # the images, the model and the index request are checked before anything is made on disk
    image_set = load_image_set(images, split, check=False)
    embedder = OnnxEmbedder(model, device)
    if index is not None:
        check_trainable(choose_index(len(image_set), embedder.dim, index).factory, embedder.dim, len(image_set))
    with job_lock(db):
        reached("locked")
        existing = _existing(db)
        if existing and not (resume or overwrite):
            raise ValueError(f"{db} already holds a gallery: pass --resume to continue its build, use `metricsearch "
                             "index add` to add images, --overwrite to replace it, or choose another --db")
        if existing and overwrite:
            for name in (LMDB_DIR, INDEX_DIR, MODEL_FILE, REPORT_FILE):
                shutil.rmtree(db / name) if (db / name).is_dir() else (db / name).unlink(missing_ok=True)
        store = Store.open(db, writable=True)
        try:
            notes = _prepare(store, db, model, embedder, images, split, index, resume and existing, settings)
            with store.read() as txn:
                settings = ReadSettings(**store.meta(txn, "settings"))
            device_info = {"onnxruntime": embedder.providers[0], "faiss": faiss_device}
            log.info("index build: embedding with %s, faiss on %s", *device_info.values())
            times = _index_images(store, image_set, images, split, embed_step or EmbedStep(embedder),
                                  embedder.preprocessing, settings, embedder.dim, resume=resume and existing,
                                  batch_size=batch_size, workers=workers, progress=progress, engine=run_on,
                                  model=db / MODEL_FILE, device=device)
            reached("embedded")
            pipeline_s, t = times.total, time.perf_counter()
            device_info["engine"] = run_on.name
            with store.read() as txn:
                ready = store.meta(txn, "state") == "ready"
            if ready:  # a finished build resumed: bring its index up to the images added now
                with Gallery.open(db, device=device, writable=True) as gallery:
                    gallery.checkpoint()
            else:
                build_faiss(store, db, None, faiss_device)
            reached("ready")
            times.index, times.total = time.perf_counter() - t, time.perf_counter() - start
            summary = _finish(store, db, times, pipeline_s, device_info, notes)
            reached("reported")
            return summary
        finally:
            store.close()


def _prepare(store: Store, db: Path, model: Path, embedder: OnnxEmbedder, images: str, split: str | None,
             index: str | None, resume: bool, settings: ReadSettings) -> list[str]:
    """Create the gallery, or check that a resumed one is the same model, images and index request."""
    with store.read() as txn:
        meta_model, job, request = store.meta(txn, "model"), store.meta(txn, "job"), store.meta(txn, "index_request")
        state = store.meta(txn, "state")
    if meta_model is None:
        _create(store, db, model, embedder, settings, index or "auto", images, split)
        return []
    check_model(meta_model, model, embedder.dim)
    if job is None or job["command"] != "build" or (job["images"], job["split"]) != (images, split):
        what = f"{job['command']} of {job['images']}" if job else "nothing"
        raise ValueError(f"--resume continues an interrupted build, and the last job here was {what}: pass the same "
                         "--images and --split, or use `metricsearch index add` for other images")
    if index is not None and index != request:
        if state == "ready":
            raise ValueError(f"this gallery was built with --index {request}; change its index with "
                             f"`metricsearch index rebuild --db {db} --index {index}`")
        store.write(lambda txn: store.put_meta(txn, "index_request", index))  # the index is not built yet
    start_job(store, "build", images, split, resume=True)
    return [f"resumed: {job['indexed']} images were indexed before, {job['duplicates']} duplicates, "
            f"{job['failed']} failed"]


def check_counts(batch_size: int, workers: int | None, ray_actors: int | None) -> None:
    """ValueError naming the first of these counts that is given and below 1."""
    for name, value in (("batch_size (--batch)", batch_size), ("workers (--workers)", workers),
                        ("ray_actors (--ray-actors)", ray_actors)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


def _engine(name: str, address: str | None, actors: int | None, embed_step: Callable | None) -> Engine:
    if name != "local" and embed_step is not None:
        raise ValueError("embed_step runs with the local engine only")
    return Engine(name, address, actors)


def run_add(gallery: Gallery, images: str, *, split: str | None = None, batch_size: int = 256,
            workers: int | None = None, progress: bool = False, embed_step: Callable[[dict], dict] | None = None,
            engine: str = "local", ray_address: str | None = None, ray_actors: int | None = None) -> JobSummary:
    """Index the images of a spec into an open, writable gallery; searches see each batch as it commits."""
    start, store = time.perf_counter(), gallery.store
    run_on = _engine(engine, ray_address, ray_actors, embed_step)
    check_counts(batch_size, workers, ray_actors)
    if not store.writable:
        raise ValueError(f"{gallery.db} was opened read-only: open it with writable=True to add images")
    image_set = load_image_set(images, split, check=False)
    start_job(store, "add", images, split, resume=False)
    embedder = gallery.embedder
    times = _index_images(store, image_set, images, split, embed_step or EmbedStep(embedder), embedder.preprocessing,
                          ReadSettings(**gallery.settings), gallery.dim, resume=False, batch_size=batch_size,
                          workers=workers, progress=progress, after_batch=gallery.refresh, engine=run_on,
                          model=embedder.path, device=gallery.device)
    pipeline_s, t = times.total, time.perf_counter()
    gallery.checkpoint()
    times.index, times.total = time.perf_counter() - t, time.perf_counter() - start
    device = {"onnxruntime": embedder.providers[0], "faiss": gallery.faiss_device, "engine": run_on.name}
    return _finish(store, gallery.db, times, pipeline_s, device, [])


def add_images(db: str | Path, images: str, *, split: str | None = None, model: str | Path | None = None,
               batch_size: int = 256, workers: int | None = None, device: str = "auto", progress: bool = False,
               embed_step: Callable[[dict], dict] | None = None, engine: str = "local", ray_address: str | None = None,
               ray_actors: int | None = None) -> JobSummary:
    """Add the images of a data set spec to a gallery with its own model (`model`: refused unless it is the
    gallery's). Images already in the gallery are skipped as exact duplicates, so an interrupted add
    continues when run again. `engine`, `ray_address`, `ray_actors`: as for build_gallery."""
    with Gallery.open(db, model=model, device=device, writable=True) as gallery:
        return gallery.add(images, split=split, batch_size=batch_size, workers=workers, progress=progress,
                           embed_step=embed_step, engine=engine, ray_address=ray_address, ray_actors=ray_actors)


def remove_items(db: str | Path, ids: Sequence[int] | None = None, label: str | None = None) -> dict:
    """Remove items by id or by label; returns {"removed": n, "ids": [...], "count": items left}."""
    with Gallery.open(db, writable=True) as gallery:
        removed = gallery.remove(ids, label)
        return {"removed": len(removed), "ids": removed.tolist(), "count": len(gallery)}


def rebuild_index(db: str | Path, index: str | None = None, device: str = "auto") -> dict:
    """Build the faiss index again from the stored embeddings (as `index`, or the type asked for before);
    drops ids removed from an index that cannot remove. Returns the gallery's info."""
    with Gallery.open(db, device=device, writable=True) as gallery:
        gallery.rebuild(index)
        return gallery.info()
