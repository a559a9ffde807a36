"""An IVF index built in shards on a Ray cluster, as autofaiss builds one on Spark (`index build --engine ray`).

The coarse quantizer (and any codebooks) is trained once here, on the sample and with the seed of the one-process
build; each of K Ray tasks adds a contiguous shard of the vectors, under the gallery's ids, to a copy of the
trained index and sends back only its inverted lists; they are merged here in shard order, so each list holds the
same ids and codes in the same order as when one process adds every vector: the same index, tuned the same way.

Only indexes whose inverted lists hold the ids shard this way: IVF-Flat, IVF-SQ, IVF-PQ (with an HNSW coarse
quantizer or an OPQ rotation too). An HNSW graph is not a set of lists that can be merged, and exact search has no
lists, so those are built in one process (`autoindex.build_index`); so is every index below SHARD_MIN vectors, which
one process fills in seconds, or on a Ray cluster of one machine, whose cores fill one index as fast (unless the
shards are asked for: bench/ray_merge.py). With `auto`, a sharded build makes auto's first IVF candidate (IVF with
an HNSW quantizer; compressed codes when memory is short), not a comparison: comparing would build every candidate
in full, and HNSW cannot be built in shards.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import faiss
import numpy as np

from .autoindex import NITER, build_index, candidates, tuned_report
from .faiss_index import TARGET_RECALL, IndexChoice, choose_index, make_index, to_cpu, train_index
from .ray_engine import ray_session

log = logging.getLogger("metricsearch.index")
SHARD_MIN = 1_000_000  # fewer vectors: the one-process build unless the shards are asked for


def unshardable(factory: str, dim: int) -> str | None:
    """Why index `factory` cannot be built in shards by merging inverted lists; None when it can."""
    made = make_index(factory, dim)  # held: the views below point into it
    index = faiss.downcast_index(made)
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexPreTransform) else index
    if isinstance(inner, faiss.IndexIVF):
        return None
    if isinstance(inner, faiss.IndexIDMap) and isinstance(faiss.downcast_index(inner.index), faiss.IndexHNSW):
        return "an HNSW graph cannot be merged from shards"
    if faiss.try_extract_index_ivf(index) is not None:
        return "it keeps more than inverted lists (an IDMap of ids or a refining index)"
    return "it has no inverted lists to merge"


def add_shard(trained: np.ndarray, vectors: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, float]:
    """On a Ray worker: a copy of the trained index (serialised) with one shard of vectors added under their
    ids; its inverted lists, serialised, and the seconds the add took."""
    index = faiss.deserialize_index(trained)
    start = time.perf_counter()
    index.add_with_ids(np.ascontiguousarray(vectors, np.float32), np.asarray(ids, np.int64))
    seconds = time.perf_counter() - start
    writer = faiss.VectorIOWriter()
    faiss.write_InvertedLists(faiss.extract_index_ivf(index).invlists, writer)
    return faiss.vector_to_array(writer.data), seconds


def merge_lists(index: faiss.Index, shell: faiss.Index, lists: np.ndarray) -> None:
    """Append a shard's serialised inverted lists (from `add_shard`) to those of the trained `index`. They are read
    into `shell`, an empty copy of it, which owns and then frees them (faiss's object read alone cannot be freed)."""
    reader = faiss.VectorIOReader()
    faiss.copy_array_to_vector(lists, reader.data)
    holder = faiss.extract_index_ivf(shell)
    holder.replace_invlists(faiss.read_InvertedLists(reader), True)  # the shard before it is freed here
    ivf = faiss.extract_index_ivf(index)
    ivf.ntotal += holder.invlists.compute_ntotal()
    ivf.invlists.merge_from(holder.invlists, 0)
    index.ntotal = ivf.ntotal  # an OPQ rotation wraps the IVF index: its count too


def add_in_shards(ray: Any, index: faiss.Index, vectors: np.ndarray, ids: np.ndarray, shards: int) -> dict:
    """Add `vectors` under `ids` to the trained, empty CPU `index` as `shards` Ray tasks (contiguous shares, one
    CPU each), merging their lists here in order; returns the seconds: the whole (`add_s`), the slowest shard's
    add on its worker (`shard_add_s`) and the merges here (`merge_s`)."""
    start = time.perf_counter()
    blob = faiss.serialize_index(index)
    trained, shell = ray.put(blob), faiss.deserialize_index(blob)
    task = ray.remote(num_cpus=1)(add_shard)
    bounds = np.linspace(0, len(vectors), shards + 1).astype(int)
    refs = [task.remote(trained, vectors[a:b], ids[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    slowest = merge_s = 0.0
    for ref in refs:  # in shard order: each list then holds its ids in the order one process adds them
        lists, seconds = ray.get(ref)
        began = time.perf_counter()
        merge_lists(index, shell, lists)
        merge_s += time.perf_counter() - began
        slowest = max(slowest, seconds)
        del lists
    return {"add_s": round(time.perf_counter() - start, 3), "shard_add_s": round(slowest, 3),
            "merge_s": round(merge_s, 3)}


def sharded_choice(n: int, dim: int, request: str = "auto",
                   memory: int | None = None) -> tuple[IndexChoice, int | None]:
    """The index a sharded build of n vectors makes for `request` (auto: its first IVF candidate) and the k-means
    iterations it is trained with (None: faiss's default, as for a named index)."""
    if request.strip().lower() != "auto":
        return choose_index(n, dim, request, memory), None
    planned = candidates(n, dim, memory)
    first = next((c for c in planned if unshardable(c.factory, dim) is None), planned[0])
    return IndexChoice(first.factory, f"auto with the Ray engine from {SHARD_MIN} vectors: its first IVF candidate, "
                                      "not compared with the others (each would be built in full)"), NITER


def default_shards(ray: Any) -> int:
    """Shards when none are asked for: one per CPU of a cluster of several machines; 1 (none) on one machine,
    whose cores fill one index as fast, and where `auto` can compare its candidates."""
    machines = sum(1 for node in ray.nodes() if node["Alive"])
    return int(ray.cluster_resources().get("CPU", 1)) if machines > 1 else 1


def build_index_on_ray(vectors: np.ndarray, ids: np.ndarray | None = None, *, index: str = "auto",
                       device: str = "cpu", target_recall: float = TARGET_RECALL, memory: int | None = None,
                       seed: int = 0, address: str | None = None,
                       shards: int | None = None) -> tuple[faiss.Index, dict]:
    """`autoindex.build_index`, with an IVF index built in `shards` shards on the Ray cluster at `address` (a new
    local one without). shards None: from SHARD_MIN vectors, `default_shards`; below, none; 1: none. The report's
    `build` says how it was built and, when it was asked for in shards but built in one process, why."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, dim = vectors.shape
    ids = np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)

    def one_process(why: str | None = None) -> tuple[faiss.Index, dict]:
        built, report = build_index(vectors, ids, target_recall=target_recall, index=index, memory=memory,
                                    device=device, seed=seed)
        if why:
            log.info("faiss: %s built in one process: %s", report["factory"], why)
            report["reason"] += f"; built in one process ({why})"
            report["build"] = {"engine": "ray", "shards": 1, "why": why}
        return built, report

    if shards == 1 or n < 2 or (shards is None and n < SHARD_MIN):
        return one_process()
    start = time.perf_counter()
    choice, niter = sharded_choice(n, dim, index, memory)
    why = unshardable(choice.factory, dim)
    if why is not None:
        return one_process(why)
    with ray_session(address) as ray:
        count = min(n, shards or default_shards(ray))
        if count > 1:
            trained, work, rows = train_index(vectors, choice.factory, device, seed, niter=niter)
            trained = trained if work is trained else to_cpu(work)
            train_s = time.perf_counter() - start
            seconds = add_in_shards(ray, trained, vectors, ids, count)
    if count == 1:
        return one_process("the Ray cluster is one machine")
    log.info("faiss: %s trained in %.1f s, added in %d shards on Ray: %s", choice.factory, train_s, count, seconds)
    choice = IndexChoice(choice.factory, f"{choice.reason}; built in {count} shards on Ray")
    report = tuned_report(trained, rows, vectors, ids, choice, target_recall, seed, start)
    report["build"] = {"engine": "ray", "shards": count, "train_s": round(train_s, 3), **seconds}
    return trained, report
