"""The indexing jobs behind `metricsearch index ...`, every change of a gallery: build (and resume),
add, remove, rebuild, checkpoint. Each holds the gallery's writer lock (`edit_gallery`); searching
is `Gallery`'s, which this module uses and which never imports it.

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
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from metricsearch.data import ImageSet, load_image_set
from metricsearch.models import OnnxEmbedder

from .autoindex import build_index, current_reason
from .build_steps import reached
from .faiss_files import UnusableIndex, save_index
from .faiss_index import INDEX_DIR, PQ_MIN, check_trainable, choose_index, describe, make_index, select_device
from .gallery import Gallery, check_model, file_sha256, finished
from .lmdb_store import FORMAT_VERSION, LMDB_DIR, NotCreated, Store
from .locks import job_lock
from .options import BuildOptions, IndexOptions
from .pipeline import Engine, ImageReader, ReadSettings, StageTimes, source_names
from .sharded_build import build_index_on_ray
from .writer import GalleryWriter, bump_version, job_record, record_job, start_job

log = logging.getLogger("metricsearch.index")
MODEL_FILE = "model.onnx"
REPORT_FILE = "report.json"
LOG_KEEP = 10_000  # commits of change log kept behind the faiss file, for readers that lag


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


def build_faiss(store: Store, db: Path, request: str | None, faiss_device: str, job: dict | None = None,
                build: Callable[..., tuple] = build_index) -> dict:
    """Build (with `build`: `build_index` or its like), tune and save the faiss index of every committed
    embedding; mark the gallery ready (and record `job`, with the index and its count, as the last job)."""
    with store.read() as txn:
        version, generation = store.version(txn), store.meta(txn, "generation", 0)
        model, request = store.meta(txn, "model"), request or store.meta(txn, "index_request", "auto")
        ids, vectors = store.vectors(txn)
    index, report = build(vectors, ids, index=request, device=faiss_device)
    log.info("faiss: %s for %d vectors (%s), built on %s", report["factory"], len(ids), report["reason"], faiss_device)
    info = describe(index)
    tuning = {k: report[k] for k in ("recall_at_10", "recall_at_10_lower", "target", "items", "dim") if k in report}
    header = {"version": version, "generation": generation + 1, "factory": report["factory"],
              "reason": report["reason"], "request": request, "params": report["params"], "tuning": tuning,
              "choice": report, "kind": info["kind"], "exact": info["exact"], "removable": info["removable"],
              "fingerprint": model["fingerprint"], "dim": int(model["dim"]), "count": len(ids),
              "built_on": faiss_device}
    save_index(db, index, header)
    reached("faiss_saved")

    def ready(txn) -> None:
        store.put_meta(txn, "index",
                       {k: header[k] for k in ("factory", "reason", "request", "params", "tuning", "kind")})
        store.put_meta(txn, "index_request", request)
        store.put_meta(txn, "generation", generation + 1)
        store.put_meta(txn, "state", "ready")
        if job is not None:
            store.put_meta(txn, "job", {**job, "index": header["factory"], "count": header["count"]})
        txn.drop(store.dbs["tombstones"], delete=False)
        store.prune_log(txn, version)
        bump_version(store, txn)

    store.write(ready)
    return header


def _index_images(store: Store, image_set: ImageSet, sources: list[str], engine: Engine, embedder: OnnxEmbedder,
                  settings: ReadSettings, options: IndexOptions, *, resume: bool = False,
                  after_batch: Callable[[], None] | None = None, desc: str = "indexing") -> StageTimes:
    """Run reader -> embedder -> writer on `engine` over `image_set` (on resume: the images not yet
    committed), each batch committed to `store`; `after_batch` runs after each commit."""
    positions = list(range(len(sources)))
    if resume:  # skip what the interrupted job committed: indexed, duplicate or failed
        with store.read() as txn:
            positions = [i for i in positions if all(txn.get(sources[i].encode(), db=store.dbs[name]) is None
                                                     for name in ("sources", "failures"))]
    writer = GalleryWriter(store)
    reader = ImageReader(image_set, sources, embedder.preprocessing, replace(settings, mode=image_set.mode),
                         writer.committed)

    def write(items, vectors) -> None:
        if vectors is not None and vectors.shape[1] != embedder.dim:
            raise ValueError(f"the embed step gave {vectors.shape[1]}-d vectors, "
                             f"the gallery holds {embedder.dim}-d ones")
        writer.write_batch(items, vectors)
        reached("batch")
        if after_batch is not None:
            after_batch()

    start = time.perf_counter()
    times = engine.run(reader, positions, write, batch_size=options.batch_for(embedder), progress=options.progress,
                       desc=desc)
    times.total = time.perf_counter() - start
    return times


def _finish(store: Store, db: Path, times: StageTimes, pipeline_s: float, device: dict, notes: list[str]) -> JobSummary:
    """The job's summary, also written with every failure and its reason to DIR/report.json."""
    with store.read() as txn:
        job, index, count = store.meta(txn, "job"), store.meta(txn, "index"), store.count(txn)
        failures = [{"path": bytes(k).decode(), "reason": bytes(v).decode()}
                    for k, v in txn.cursor(db=store.dbs["failures"])]
    if index is not None:
        index = {**index, "reason": current_reason(index, count)}
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
            images: str, part: str | None) -> None:
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
        record_job(store, txn, "build", images, part, resume=False)

    store.write(fn)
    reached("created")


def build_gallery(model: str | Path, images: str, db: str | Path, options: BuildOptions | None = None,
                  **overrides: Any) -> JobSummary:
    """Index every image of a data set spec into a new gallery folder `db` with the exported ONNX
    `model`, as `options` (a BuildOptions; keyword arguments override its fields, e.g. `part="test"`)
    say. `resume` continues an interrupted build. Unreadable images are skipped and listed in
    DIR/report.json; exact duplicates are stored once."""
    start, db, model = time.perf_counter(), Path(db), Path(model)
    options = replace(options or BuildOptions(), **overrides)
    faiss_device = select_device(options.device)
    settings = options.read_settings()
    part = options.part
    # the images, the model and the index request are checked before anything is made on disk
    image_set = load_image_set(images, part, check=False)
    embedder = OnnxEmbedder(model, options.device, arena=False)  # a batch job: see OnnxEmbedder
    if options.index is not None:
        check_trainable(choose_index(len(image_set), embedder.dim, options.index).factory, embedder.dim, len(image_set))
    with job_lock(db):
        reached("locked")
        existing = _existing(db)
        if existing and not (options.resume or options.overwrite):
            raise ValueError(f"{db} already holds a gallery: pass --resume to continue its build, use `metricsearch "
                             "index add` to add images, --overwrite to replace it, or choose another --db")
        if existing and options.overwrite:
            for name in (LMDB_DIR, INDEX_DIR, MODEL_FILE, REPORT_FILE):
                shutil.rmtree(db / name) if (db / name).is_dir() else (db / name).unlink(missing_ok=True)
        resume = options.resume and existing
        with Store.opened(db, writable=True) as store:
            notes = _prepare(store, db, model, embedder, images, part, options.index, resume, settings)
            with store.read() as txn:
                settings = ReadSettings(**store.meta(txn, "settings"))
            device_info = {"onnxruntime": embedder.providers[0], "faiss": faiss_device}
            log.info("index build: embedding with %s, faiss on %s", *device_info.values())
            engine = options.make_engine(embedder, db / MODEL_FILE)
            times = _index_images(store, image_set, source_names(image_set, images, part), engine, embedder,
                                  settings, options, resume=resume, desc=f"indexing {images}")
            reached("embedded")
            pipeline_s, t = times.total, time.perf_counter()
            device_info["engine"] = engine.name
            with store.read() as txn:
                ready = store.meta(txn, "state") == "ready"
            if ready:  # a finished build resumed: bring its index up to the images added now
                with edit_gallery(db, device=options.device) as editor:
                    editor.checkpoint()
            else:
                build = (partial(build_index_on_ray, address=options.ray_address, shards=options.ray_shards)
                         if engine.name == "ray" else partial(build_index, memory=options.index_memory))
                build_faiss(store, db, None, faiss_device, build=build)
            reached("ready")
            times.index, times.total = time.perf_counter() - t, time.perf_counter() - start
            summary = _finish(store, db, times, pipeline_s, device_info, notes)
            reached("reported")
            return summary


def _prepare(store: Store, db: Path, model: Path, embedder: OnnxEmbedder, images: str, part: str | None,
             index: str | None, resume: bool, settings: ReadSettings) -> list[str]:
    """Create the gallery, or check that a resumed one is the same model, images and index request."""
    with store.read() as txn:
        meta_model, job, request = store.meta(txn, "model"), store.meta(txn, "job"), store.meta(txn, "index_request")
        state = store.meta(txn, "state")
    if meta_model is None:
        _create(store, db, model, embedder, settings, index or "auto", images, part)
        return []
    check_model(meta_model, model, embedder.dim)
    part_done = job and job.get("part", job.get("split"))  # jobs recorded before the rename say "split"
    if job is None or job["command"] != "build" or (job["images"], part_done) != (images, part):
        what = "nothing" if job is None else job["command"] + (f" of {job['images']}" if job.get("images") else "")
        raise ValueError(f"--resume continues an interrupted build, and the last job here was {what}: pass the same "
                         "--images and --part, or use `metricsearch index add` for other images")
    if index is not None and index != request:
        if state == "ready":
            raise ValueError(f"this gallery was built with --index {request}; change its index with "
                             f"`metricsearch index rebuild --db {db} --index {index}`")
        store.write(lambda txn: store.put_meta(txn, "index_request", index))  # the index is not built yet
    start_job(store, "build", images, part, resume=True)
    return [f"resumed: {job['indexed']} images were indexed before, {job['duplicates']} duplicates, "
            f"{job['failed']} failed"]


class Editor:
    """The changes of one open gallery, made under its writer lock: `add`, `remove`, `checkpoint`; `gallery`
    searches it and sees each change as it commits. Made by `edit_gallery` (which also rebuilds its index)."""

    def __init__(self, db: Path, store: Store, gallery: Gallery) -> None:
        self.db, self.store, self.gallery = db, store, gallery

    def add(self, images: str, options: IndexOptions | None = None, **overrides: Any) -> JobSummary:
        """Index the images of a spec into the gallery (see `add_images`); searches see each batch as it commits."""
        start, store, gallery = time.perf_counter(), self.store, self.gallery
        options = replace(options or IndexOptions(), **overrides)
        image_set = load_image_set(images, options.part, check=False)
        start_job(store, "add", images, options.part, resume=False)
        embedder = gallery.embedder
        engine = options.make_engine(embedder, embedder.path)
        times = _index_images(store, image_set, source_names(image_set, images, options.part), engine, embedder,
                              ReadSettings(**gallery.settings), options, after_batch=gallery.refresh,
                              desc=f"indexing {images}")
        pipeline_s, t = times.total, time.perf_counter()
        self.checkpoint()
        times.index, times.total = time.perf_counter() - t, time.perf_counter() - start
        device = {"onnxruntime": embedder.providers[0], "faiss": gallery.faiss_device, "engine": engine.name}
        return _finish(store, self.db, times, pipeline_s, device, [])

    def remove(self, ids: Sequence[int] | None = None, label: str | None = None) -> np.ndarray:
        """Remove items by id or by label; returns the ids removed (ValueError for unknown ones)."""
        if (ids is None) == (label is None):
            raise ValueError("remove takes ids or a label (one of the two)")
        catalog = self.gallery.catalog
        if label is None:  # as Python ints: an id past int64 is unknown too, not an overflow
            known = set(catalog.ids.tolist())
            unknown = sorted({int(i) for i in ids} - known)
            targets = np.array(sorted({int(i) for i in ids} & known), dtype=np.int64)
        else:
            targets, unknown = catalog.label_ids(label), []
        if len(unknown):
            raise ValueError(f"no item with id {', '.join(map(str, unknown[:10]))} in {self.db}; nothing removed")
        removed = GalleryWriter(self.store).remove(targets, tombstones=not self.gallery.removable,
                                                   job=job_record("remove", label=label))
        self.gallery.refresh()
        self.checkpoint()
        return removed

    def checkpoint(self) -> Path:
        """Save the searched index as the faiss file of the current version; trim the change log."""
        with self.gallery.snapshot() as state:
            version = state.version
            header = dict(state.header, version=version, generation=state.generation, count=len(state.catalog))
            path = save_index(self.db, state.index, header)

        def trim(txn) -> None:
            self.store.prune_log(txn, version - LOG_KEEP)
            bump_version(self.store, txn)

        self.store.write(trim)
        return path


@contextmanager
def edit_gallery(db: str | Path, *, model: str | Path | None = None, device: str = "auto", rebuild: bool = False,
                 index: str | None = None) -> Iterator[Editor]:
    """A built gallery open for changes for the block: its writer lock held, its LMDB writable (both
    released after); `model` is refused unless it is the gallery's. With `rebuild`, its faiss index is
    built again from the stored embeddings first (as `index`, by default the type asked for before);
    a faiss file that cannot serve is rebuilt that way too."""
    db = Path(db)
    with ExitStack() as stack:
        stack.enter_context(job_lock(db))
        store = stack.enter_context(Store.opened(db, writable=True))
        if rebuild:
            finished(db, store)  # an interrupted build is not marked ready with the images it holds so far
            build_faiss(store, db, index, select_device(device), job_record("rebuild"))
        try:
            gallery = Gallery(db, store, model, device)
        except UnusableIndex as exc:
            log.warning("%s; rebuilding it from the stored embeddings now", str(exc).split(": run ")[0])
            build_faiss(store, db, index, select_device(device))
            gallery = Gallery(db, store, model, device)
        yield Editor(db, store, stack.enter_context(gallery))


def add_images(db: str | Path, images: str, options: IndexOptions | None = None, *, model: str | Path | None = None,
               **overrides: Any) -> JobSummary:
    """Add the images of a data set spec to a gallery with its own model (`model`: refused unless it is the
    gallery's), as `options` (an IndexOptions; keyword arguments override its fields). Images already
    in the gallery are skipped as exact duplicates, so an interrupted add continues when run again."""
    options = replace(options or IndexOptions(), **overrides)
    with edit_gallery(db, model=model, device=options.device) as editor:
        return editor.add(images, options)


def remove_items(db: str | Path, ids: Sequence[int] | None = None, label: str | None = None) -> dict:
    """Remove items by id or by label; returns {"removed": n, "ids": [...], "count": items left}."""
    with edit_gallery(db) as editor:
        removed = editor.remove(ids, label)
        return {"removed": len(removed), "ids": removed.tolist(), "count": len(editor.gallery)}


def rebuild_index(db: str | Path, index: str | None = None, device: str = "auto") -> dict:
    """Build the faiss index again from the stored embeddings (as `index`, or the type asked for before);
    drops ids removed from an index that cannot remove. Returns the gallery's info."""
    with edit_gallery(db, device=device, rebuild=True, index=index) as editor:
        return editor.gallery.info()
