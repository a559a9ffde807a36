"""The engines that run the indexing stages: `LocalEngine` (decoding threads, one embedding thread
and the writer in this process, bounded queues between them: memory stays flat and the slowest
stage sets the pace) and, by name, `ray` (`ray_engine.RayEngine`)."""

from __future__ import annotations

import queue
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from metricsearch.models import ordered_batches

from .pipeline import Engine, ImageReader, ReadItem, StageTimes, WriteFn, write_batches
from .ray_engine import RayEngine, import_ray

ENGINES = ("local", "ray")


class _Stop(Exception):
    """The run is over (done, or failed in another stage): a stage thread leaves."""


_DONE = object()


class _LocalRun:
    """One local run: the reading and embedding threads and the queues that feed the writer."""

    def __init__(self, read: ImageReader, positions: list[int], embed: Callable[[dict], dict], batch_size: int,
                 workers: int | None, times: StageTimes) -> None:
        self.read, self.positions, self.embed = read, positions, embed
        self.batch_size, self.workers, self.times = batch_size, workers, times
        self.stop = threading.Event()
        self.to_embed: queue.Queue = queue.Queue(1)
        self.to_write: queue.Queue = queue.Queue(1)
        self.in_flight: set[bytes] = set()  # read, not yet written: the first of identical images is kept
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=f, name=f"index-{f.__name__.strip('_')}", daemon=True)
                        for f in (self._reading, self._embedding)]

    def __enter__(self) -> _LocalRun:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()

    def _put(self, q: queue.Queue, value: Any) -> None:
        while not self.stop.is_set():
            try:
                return q.put(value, timeout=0.1)
            except queue.Full:
                pass
        raise _Stop

    def _get(self, q: queue.Queue) -> Any:
        while not self.stop.is_set():
            try:
                return q.get(timeout=0.1)
            except queue.Empty:
                pass
        raise _Stop

    def _dedupe(self, item: ReadItem) -> None:
        with self.lock:
            seen = item.sha256 in self.in_flight
        if seen or self.read.committed(item.sha256):
            item.status, item.pixels, item.thumbnail = "duplicate", None, b""
        else:
            with self.lock:
                self.in_flight.add(item.sha256)

    def _reading(self) -> None:
        try:
            batches = ordered_batches(lambda j: self.read(self.positions[j]), len(self.positions), self.batch_size,
                                      self.workers, prefetch=1)
            with closing(batches):
                for _, items in batches:
                    for item in items:
                        self.times.read += item.seconds
                        if item.status == "ok":
                            self._dedupe(item)
                    self._put(self.to_embed, items)
            self._put(self.to_embed, _DONE)
        except _Stop:
            pass
        except BaseException as exc:  # handed to the writer, which raises it
            self._put(self.to_embed, exc)

    def _embedding(self) -> None:
        try:
            while True:
                start = time.perf_counter()
                items = self._get(self.to_embed)
                self.times.embed_wait += time.perf_counter() - start
                if items is _DONE or isinstance(items, BaseException):
                    return self._put(self.to_write, items)
                ok = [it for it in items if it.status == "ok"]
                vectors = None
                if ok:
                    start = time.perf_counter()
                    vectors = self.embed({"pixels": np.stack([it.pixels for it in ok])})["embedding"]
                    self.times.embed += time.perf_counter() - start
                    for it in ok:
                        it.pixels = None
                self._put(self.to_write, (items, vectors))
        except _Stop:
            pass
        except BaseException as exc:
            self._put(self.to_write, exc)

    def batches(self) -> Iterator[tuple[list[ReadItem], np.ndarray | None]]:
        """The embedded batches in order, for the writer; an error of another stage is raised here."""
        while True:
            got = self._get(self.to_write)
            if got is _DONE:
                return
            if isinstance(got, BaseException):
                raise got
            yield got
            with self.lock:  # written: a later copy is now found committed
                self.in_flight.difference_update(it.sha256 for it in got[0] if it.status == "ok")


class LocalEngine:
    """Runs the stages in this process: `workers` decoding threads (default: one per core, at most 8),
    `embed` (a callable over {"pixels"} batches) in one thread, the writer in the caller's."""

    name = "local"

    def __init__(self, embed: Callable[[dict], dict], workers: int | None = None) -> None:
        self.embed, self.workers = embed, workers

    def run(self, reader: ImageReader, positions: list[int], write: WriteFn, *, batch_size: int = 256,
            progress: bool = False, desc: str = "indexing") -> StageTimes:
        """Read, embed and write the images at `positions` in order."""
        from tqdm.auto import tqdm

        times = StageTimes(items=len(positions))
        with (tqdm(total=len(positions), desc=desc, unit="img", disable=None if progress else True,
                   smoothing=0.05) as bar,
              _LocalRun(reader, positions, self.embed, batch_size, self.workers, times) as run):
            write_batches(run.batches(), write, times, bar)
        return times


def check_engine(engine: str) -> str:
    """`engine` when it is local or ray (ValueError otherwise); ray: ImportError without Ray."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "ray":
        import_ray()
    return engine


def make_engine(name: str, embed: Callable[[dict], dict], model: Path, *, workers: int | None = None,
                device: str = "auto", ray_address: str | None = None, ray_actors: int | None = None) -> Engine:
    """The engine called `name`: local (`embed` in threads here, `workers` decoding threads) or ray
    (the ONNX file `model` on `ray_actors` actors of the cluster at `ray_address`)."""
    makers: dict[str, Callable[[], Engine]] = {
        "local": lambda: LocalEngine(embed, workers),
        "ray": lambda: RayEngine(model, device, ray_address, ray_actors),
    }
    return makers[check_engine(name)]()
