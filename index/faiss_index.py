"""The faiss side of a gallery: which index to build, building it (on GPUs when faiss sees them),
tuning nprobe / efSearch for a recall target, saving it beside the LMDB, and reading it back.

Every index uses inner product on L2-normalised vectors and explicit 64-bit ids (IVF indexes
hold ids themselves; the others are wrapped in IndexIDMap), so ids stay stable through additions
and removals. Named choices: `flat` (exact), `ivf` (IVF-Flat), `ivfpq` (IVF-PQ), `hnsw` (HNSW32);
anything else is taken as a faiss factory string.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import faiss
import numpy as np

from metricsearch.models.device import check_device

log = logging.getLogger("metricsearch.index")

INDEX_DIR = "index"
FLAT_MAX = 50_000  # auto: exact search up to this many items
MEMORY_FRACTION = 0.5  # auto: the index may take this share of the available memory
TRAIN_PER_LIST = 40  # IVF training points per list (faiss asks for at least 39)
HNSW_MIN_PER_LIST = 16  # ...at least, with an HNSW coarse quantizer, when the gallery has fewer (its lists are many)
PQ_MIN = 1_000  # fewest vectors to train IVF-PQ on
TARGET_RECALL = 0.95
TUNE_K = 10
TUNE_QUERIES = 4_000  # enough for the recall estimate to be within about +-0.005
PARAMS = {"ivf": "nprobe", "ivfpq": "nprobe", "hnsw": "efSearch"}
RERANK = (64, 32, 16, 8, 4, 2)  # shortlists tried for lossy codes (largest first), x max(k, TUNE_K): `shortlist`
ADD_CHUNK = 1 << 17  # vectors added to an IVF index at once (bounds the rotated copy of OPQ)
RERANK_CHUNK = 64  # queries re-scored at once (bounds the memory of the vectors read for them)
PLATEAU = 0.002  # lossy codes: a doubled nprobe / efSearch that gains less recall than this is their ceiling


def select_device(device: str = "auto", num_gpus: int | None = None) -> str:
    """`gpu` or `cpu` for faiss: GPUs when faiss sees any (auto), or as `device` (auto|cpu|cuda) says."""
    check_device(device, indexed=False)
    gpus = faiss.get_num_gpus() if num_gpus is None else num_gpus
    if device == "cuda" and gpus < 1:
        raise ValueError("device 'cuda' was asked for but faiss sees no GPU (faiss-cpu is installed, or no "
                         "GPU is visible); install the `gpu` extra or use --device cpu")
    if device == "auto" and gpus < 1 and hasattr(faiss, "StandardGpuResources"):
        log.warning("faiss was built with GPU support but sees no GPU (no driver, or CUDA_VISIBLE_DEVICES hides "
                    "them), so the index is searched on the CPU")
    return "gpu" if device != "cpu" and gpus > 0 else "cpu"


def available_memory() -> int:
    """Bytes of memory available now (MemAvailable on Linux; else physical memory)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def ivf_lists(n: int) -> int:
    """IVF lists for n vectors: the power of two at or above 4*sqrt(n) (so within 4..8*sqrt(n)),
    fewer when n cannot give each list TRAIN_PER_LIST training points."""
    lists = 2 ** math.ceil(math.log2(max(1.0, 4 * math.sqrt(n))))
    return max(1, min(lists, n // TRAIN_PER_LIST))


def pq_bytes(dim: int, n: int, budget: float) -> int:
    """Bytes per PQ code: the largest divisor of dim up to dim/4 (sub-vectors of 4+ dimensions)
    whose codes (+ ids) fit `budget`."""
    sizes = [m for m in range(1, dim // 4 + 1) if dim % m == 0] or [1]
    fitting = [m for m in sizes if n * (m + 8) <= budget]
    return max(fitting) if fitting else min(sizes)


@dataclass(frozen=True)
class IndexChoice:
    """A faiss factory string and why it was chosen."""

    factory: str
    reason: str


def choose_index(n: int, dim: int, request: str = "auto", memory: int | None = None) -> IndexChoice:
    """The index for n vectors of `dim`: a named choice, a factory string, or `auto` by size and memory."""
    name = request.strip().lower()
    budget = MEMORY_FRACTION * (memory if memory is not None else available_memory())
    if name == "auto":
        if n * (4 * dim + 8) > budget and n >= PQ_MIN:
            choice = choose_index(n, dim, "ivfpq", memory)
            return IndexChoice(choice.factory, f"{n} vectors as float32 exceed {budget / 2**30:.1f} GiB: compressed")
        if n <= FLAT_MAX:
            return IndexChoice("IDMap,Flat", f"{n} <= {FLAT_MAX} vectors: exact search")
        return IndexChoice(choose_index(n, dim, "ivf").factory, f"{n} > {FLAT_MAX} vectors: inverted lists")
    if name == "flat" or n == 0 and name in ("ivf", "ivfpq"):
        return IndexChoice("IDMap,Flat", "asked for" if name == "flat" else "an empty gallery: exact search")
    if name == "ivf":
        return IndexChoice(f"IVF{ivf_lists(n)},Flat", "asked for")
    if name == "ivfpq":
        if n < PQ_MIN:
            raise ValueError(f"IVF-PQ needs at least {PQ_MIN} vectors to train its codebooks, the gallery has {n}: "
                             "use --index flat or ivf")
        bits = 8 if n >= 256 * TRAIN_PER_LIST else 4
        # np: no polysemous training (slow, and only for Hamming-filtered search, which is not used)
        return IndexChoice(f"IVF{ivf_lists(n)},PQ{pq_bytes(dim, n, budget)}x{bits}np", "asked for")
    if name == "hnsw":
        return IndexChoice("IDMap,HNSW32", "asked for")
    return IndexChoice(request.strip(), "faiss factory string")


def _inner(index: faiss.Index) -> tuple[faiss.Index, bool]:
    """The index under IDMap / pre-transform wrappers, and whether a pre-transform changes vectors."""
    index, transformed = faiss.downcast_index(index), False
    while isinstance(index, (faiss.IndexIDMap, faiss.IndexIDMap2, faiss.IndexPreTransform)):
        transformed |= isinstance(index, faiss.IndexPreTransform)
        index = faiss.downcast_index(index.index)
    return index, transformed


def describe(index: faiss.Index) -> dict:
    """kind (flat, ivf, ivfpq, hnsw or other), exact, lossy (codes that are not the float vectors: PQ, SQ), the
    tunable parameter, and whether ids can be removed."""
    inner, transformed = _inner(index)
    kind = ("ivfpq" if isinstance(inner, faiss.IndexIVFPQ) else "ivf" if isinstance(inner, faiss.IndexIVF)
            else "hnsw" if isinstance(inner, faiss.IndexHNSW) else "flat" if isinstance(inner, faiss.IndexFlat)
            else "other")
    storage = faiss.downcast_index(inner.storage) if isinstance(inner, faiss.IndexHNSW) else inner
    code_size = getattr(storage, "code_size", 4 * index.d)
    try:
        index.remove_ids(faiss.IDSelectorBatch(np.zeros(0, dtype=np.int64)))
        removable = True
    except RuntimeError:
        removable = False
    return {"kind": kind, "exact": kind == "flat" and not transformed, "lossy": code_size < 4 * index.d,
            "param": PARAMS.get(kind), "removable": removable}


def make_index(factory: str, dim: int) -> faiss.Index:
    """An empty inner-product index from a factory string, with explicit ids (IDMap where needed)."""
    try:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise ValueError(f"faiss cannot build index {factory!r} for {dim}-d vectors: "
                         f"{str(exc).splitlines()[-1]}") from exc
    if faiss.try_extract_index_ivf(index) is None and not isinstance(faiss.downcast_index(index), faiss.IndexIDMap):
        index = faiss.IndexIDMap(index)
    return index


def check_trainable(factory: str, dim: int, n: int) -> None:
    """ValueError unless faiss can train index `factory` on n vectors (an IVF index needs one per list)."""
    index = make_index(factory, dim)  # held: the IVF view below points into it
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None and n < ivf.nlist:
        raise ValueError(f"faiss index {factory} has {ivf.nlist} lists and needs at least that many vectors to "
                         f"train, the gallery has {n}: choose another --index (auto, flat, or fewer lists)")


GPU_FRACTION = 0.8  # an index may take this share of a GPU's free memory (the rest: search scratch space)


def gpu_plan(num_gpus: int, index_bytes: int, free_per_gpu: list[int] | None = None) -> str:
    """Where an index of `index_bytes` goes: `cpu` (no GPU, or it fits nowhere), `gpu` (the one GPU),
    `replicate` (a full copy on each of several GPUs: it fits on one), `shard` (split across them:
    it does not fit on one, its shares do). `free_per_gpu` unknown (None): it is taken to fit."""
    if num_gpus < 1:
        return "cpu"
    free = sorted(free_per_gpu or [])[:num_gpus]
    smallest = GPU_FRACTION * free[0] if len(free) == num_gpus else math.inf
    if index_bytes <= smallest:
        return "gpu" if num_gpus == 1 else "replicate"
    if num_gpus > 1 and math.ceil(index_bytes / num_gpus) <= smallest:
        return "shard"
    return "cpu"


def gpu_free_memory(num_gpus: int) -> list[int] | None:
    """Free bytes on each GPU faiss sees (CUDA_VISIBLE_DEVICES order), from nvidia-smi; None if unknown."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        free = [int(line) << 20 for line in out.split()]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:
            free = [free[int(i)] for i in visible.split(",")]
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None
    return free[:num_gpus] if len(free) >= num_gpus else None


def memory_bytes(index: faiss.Index, n: int | None = None) -> int:
    """Bytes an index takes in memory (codes and ids, plus IVF centroids) when it holds `n` vectors
    (default: its own); faiss_files.index_bytes is the size of its saved file."""
    n = index.ntotal if n is None else n
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        return n * (ivf.code_size + 8) + ivf.nlist * ivf.d * 4
    return n * (getattr(_inner(index)[0], "code_size", 4 * index.d) + 8)


def to_device(index: faiss.Index, device: str, n: int | None = None) -> faiss.Index:
    """The index for work on `device` (cpu|gpu): with gpu, on every GPU faiss sees by `gpu_plan` (for
    `n` vectors, default its own): replicated when it fits on one, sharded when it does not, or the
    CPU index itself (no room, or an index type faiss cannot put on GPUs)."""
    if device != "gpu":
        return index
    gpus = faiss.get_num_gpus()
    plan = gpu_plan(gpus, memory_bytes(index, n), gpu_free_memory(gpus))
    log.info("faiss: %s over %d GPU(s)", plan, gpus)
    if plan == "cpu":
        return index
    try:
        options = faiss.GpuMultipleClonerOptions()
        options.shard = plan == "shard"
        return faiss.index_cpu_to_all_gpus(index, co=options, ngpu=1 if plan == "gpu" else gpus)
    except (RuntimeError, AttributeError) as exc:
        log.info("faiss: this index stays on the CPU (%s)", str(exc).splitlines()[-1] if str(exc) else exc)
        return index


def to_cpu(index: faiss.Index) -> faiss.Index:
    """A CPU copy of an index made by to_device (on GPUs, replicated or sharded)."""
    return faiss.index_gpu_to_cpu(index) if hasattr(faiss, "index_gpu_to_cpu") else index


def _prepare_training(index: faiss.Index, niter: int | None) -> int:
    """Set up an IVF index's k-means (`niter` iterations, faiss's default when None, also for PQ codebooks and an
    OPQ rotation's rounds; with an HNSW coarse quantizer, assignments through an HNSW16 graph) and return how many
    training vectors it wants."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        return 100_000
    if niter is not None:
        ivf.cp.niter = niter
        if isinstance(faiss.downcast_index(ivf), faiss.IndexIVFPQ):
            faiss.downcast_index(ivf).pq.cp.niter = niter
        outer = faiss.downcast_index(index)
        for i in range(outer.chain.size() if isinstance(outer, faiss.IndexPreTransform) else 0):
            rotation = faiss.downcast_VectorTransform(outer.chain.at(i))
            if isinstance(rotation, faiss.OPQMatrix):
                rotation.niter = rotation.niter_pq_0 = niter
    if isinstance(faiss.downcast_index(ivf.quantizer), faiss.IndexHNSW):
        ivf.clustering_index = faiss.IndexHNSWFlat(ivf.d, 16)  # flat k-means over 10^4+ lists takes hours
        ivf.cp.min_points_per_centroid = HNSW_MIN_PER_LIST
    return TRAIN_PER_LIST * ivf.nlist


def coarse_spec(factory: str) -> str | None:
    """The coarse quantizer part of an IVF factory string (`IVF4096` or `IVF65536_HNSW32`; None: not IVF)."""
    found = re.search(r"(?:^|,)(IVF\d+(?:_HNSW\d+)?)(?:,|$)", factory)
    return found.group(1) if found else None


def coarse_centroids(index: faiss.Index) -> np.ndarray | None:
    """The trained coarse centroids of an IVF index whose vectors are not transformed first (else None)."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None or _inner(index)[1] or ivf.quantizer.ntotal != ivf.nlist:
        return None
    return ivf.quantizer.reconstruct_n(0, ivf.nlist)


def _train_around(index: faiss.Index, sample: np.ndarray, centroids: np.ndarray) -> None:
    """Train a CPU IVF index on `sample` with the coarse `centroids` of another (`coarse_centroids`) in place of
    its own k-means: a rotation before it (OPQ) is trained first and turns them too (an orthonormal rotation
    moves a k-means solution to the rotated one), then only the codes (PQ codebooks, SQ ranges) are trained."""
    outer = faiss.downcast_index(index)
    chain = outer.chain if isinstance(outer, faiss.IndexPreTransform) else None
    for i in range(chain.size() if chain is not None else 0):
        step = faiss.downcast_VectorTransform(chain.at(i))
        if not step.is_trained:
            step.train(sample)
        if not (isinstance(step, faiss.LinearTransform) and step.is_orthonormal and step.d_in == step.d_out):
            raise ValueError(f"coarse centroids cannot cross {type(step).__name__}: it is not a rotation")
        sample, centroids = step.apply(sample), step.apply(centroids)
    ivf = faiss.extract_index_ivf(index)
    if centroids.shape != (ivf.nlist, ivf.d):
        raise ValueError(f"{len(centroids)} coarse centroids of {centroids.shape[1]}-d for {ivf.nlist} lists of "
                         f"{ivf.d}-d")
    ivf.quantizer.add(np.ascontiguousarray(centroids, dtype=np.float32))  # a full quantizer: IVF skips k-means
    (faiss.downcast_index(outer.index) if chain is not None else outer).train(np.ascontiguousarray(sample))
    outer.is_trained = True


def train_index(vectors: np.ndarray, factory: str, device: str = "cpu", seed: int = 0,
                exclude: np.ndarray | None = None, niter: int | None = None,
                centroids: np.ndarray | None = None) -> tuple[faiss.Index, faiss.Index, np.ndarray]:
    """An empty index `factory` for `vectors`, trained as `index_from_factory` trains it: the CPU index, the one
    to add to (the same, or its copy on the GPUs with device gpu) and the rows of the training sample.
    `centroids`: the coarse centroids of an IVF index with the same lists (`coarse_centroids`), to train only
    the rest (on the CPU)."""
    check_trainable(factory, vectors.shape[1], len(vectors))
    index = make_index(factory, vectors.shape[1])
    rows = np.zeros(0, dtype=np.int64)
    work = to_device(index, device, len(vectors)) if centroids is None else index
    if not index.is_trained:
        want = _prepare_training(index, niter)
        pool = np.setdiff1d(np.arange(len(vectors)), exclude if exclude is not None else [])
        pool = pool if len(pool) >= min(want, len(vectors)) else np.arange(len(vectors))
        size = min(len(pool), want)
        rows = np.sort(np.random.default_rng(seed).choice(pool, size=size, replace=False))
        try:
            if centroids is not None:
                _train_around(work, np.ascontiguousarray(vectors[rows]), centroids)
            else:
                work.train(np.ascontiguousarray(vectors[rows]))
        except RuntimeError as exc:
            detail = str(exc).strip().splitlines()[-1]
            raise ValueError(f"faiss cannot train index {factory} on {size} vectors ({detail}): choose another "
                             "--index (auto or flat)") from exc
    ivf = faiss.try_extract_index_ivf(work)
    if ivf is not None and isinstance(faiss.downcast_index(ivf.quantizer), faiss.IndexHNSW):
        faiss.downcast_index(ivf.quantizer).hnsw.efSearch = 32  # each vector's list, found well enough
    return index, work, rows


def add_vectors(index: faiss.Index, vectors: np.ndarray, ids: np.ndarray,
                lists: np.ndarray | None = None) -> np.ndarray | None:
    """Add `vectors` under `ids` to a trained index; to a CPU IVF index through `lists`, each vector's coarse list
    (assigned by its quantizer when None), and return those lists (None for other indexes)."""
    ivf = faiss.try_extract_index_ivf(index)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if not isinstance(ivf, faiss.IndexIVF):
        index.add_with_ids(np.ascontiguousarray(vectors), ids)
        return None
    outer = faiss.downcast_index(index)
    chain = outer.chain if isinstance(outer, faiss.IndexPreTransform) else None
    out = np.empty(len(vectors), np.int64) if lists is None else np.ascontiguousarray(lists, dtype=np.int64)
    for start in range(0, len(vectors), ADD_CHUNK):
        x = np.ascontiguousarray(vectors[start:start + ADD_CHUNK], dtype=np.float32)
        for i in range(chain.size() if chain is not None else 0):
            x = np.ascontiguousarray(chain.at(i).apply(x))
        part = slice(start, start + len(x))
        if lists is None:
            out[part] = ivf.quantizer.search(x, 1)[1][:, 0]
        ivf.add_core(len(x), faiss.swig_ptr(x), faiss.swig_ptr(ids[part]), faiss.swig_ptr(out[part]))
    if chain is not None:
        outer.ntotal = ivf.ntotal
    return out


def index_from_factory(vectors: np.ndarray, ids: np.ndarray, factory: str, device: str = "cpu", seed: int = 0,
                       exclude: np.ndarray | None = None, niter: int | None = None,
                       shared: dict | None = None) -> tuple[faiss.Index, np.ndarray]:
    """An index of `vectors` under `ids`, trained (k-means of `niter` iterations for IVF, faiss's default
    when None) on a random sample (on the GPUs with device gpu) of the rows not in `exclude` (of all
    rows when the others are too few); returns the CPU index and the rows of the training sample.
    `shared`: coarse lists already made for these vectors (by `coarse_spec`: centroids and each vector's list),
    on the CPU: an IVF index with the same lists takes them instead of its own k-means and assignment (the same
    sample and seed would make the same), and the first of each is put there for the next."""
    spec = coarse_spec(factory) if shared is not None and device == "cpu" else None
    centroids, lists = shared.get(spec, (None, None)) if spec else (None, None)
    index, work, rows = train_index(vectors, factory, device, seed, exclude, niter, centroids)
    lists = add_vectors(work, vectors, ids, lists)
    if spec and spec not in shared and (own := coarse_centroids(index)) is not None:
        shared[spec] = (own, lists)
    return (index if work is index else to_cpu(work)), rows


def set_param(index: faiss.Index, name: str, value: int) -> None:
    """Set nprobe or efSearch on an index, through its wrappers; with nprobe, an HNSW coarse quantizer's
    efSearch too (4x nprobe, 32 at least: it returns no more lists than its efSearch, and finds the
    nearest lists better with room to spare)."""
    faiss.ParameterSpace().set_index_parameter(index, name, int(value))
    ivf = faiss.try_extract_index_ivf(index) if name == "nprobe" else None
    quantizer = faiss.downcast_index(ivf.quantizer) if ivf is not None else None
    if isinstance(quantizer, faiss.IndexHNSW):
        quantizer.hnsw.efSearch = max(4 * int(value), 32)


def recalls_without_self(found: np.ndarray, exact: np.ndarray, query_ids: np.ndarray, k: int) -> np.ndarray:
    """Per query, the share of its exact k nearest (itself left out) that `found` holds."""
    out = []
    for f, e, q in zip(found, exact, query_ids):
        truth = [i for i in e if i != q and i >= 0][:k]
        got = {i for i in f if i != q and i >= 0}
        out.append(len(got.intersection(truth)) / max(len(truth), 1))
    return np.array(out)


def recall_without_self(found: np.ndarray, exact: np.ndarray, query_ids: np.ndarray, k: int) -> float:
    """Mean recall@k of `found` against `exact`, each query itself left out."""
    return float(recalls_without_self(found, exact, query_ids, k).mean())


@dataclass(frozen=True)
class TuningQueries:
    """Gallery vectors that query the rest during tuning, their ids, and their exact k+1 nearest ids."""

    rows: np.ndarray
    queries: np.ndarray
    query_ids: np.ndarray
    exact: np.ndarray


def tuning_queries(vectors: np.ndarray, ids: np.ndarray, held_out: np.ndarray | None = None, *,
                   k: int = TUNE_K, n_queries: int = TUNE_QUERIES, seed: int = 0) -> TuningQueries:
    """Up to `n_queries` gallery vectors (from `held_out` rows, those an index was not trained on, when
    there are enough) and their exact k+1 nearest neighbours among `vectors`."""
    pool = (held_out if held_out is not None and len(held_out) >= min(n_queries, len(vectors)) // 2
            else np.arange(len(vectors)))
    rows = np.random.default_rng(seed).choice(pool, size=min(n_queries, len(pool)), replace=False)
    queries = np.ascontiguousarray(vectors[rows])
    _, exact_rows = faiss.knn(queries, np.ascontiguousarray(vectors), k + 1, metric=faiss.METRIC_INNER_PRODUCT)
    return TuningQueries(rows, queries, ids[rows], np.where(exact_rows >= 0, ids[exact_rows.clip(0)], -1))


def tune(index: faiss.Index, vectors: np.ndarray, ids: np.ndarray, held_out: np.ndarray | None = None, *,
         target: float = TARGET_RECALL, k: int = TUNE_K, n_queries: int = TUNE_QUERIES, seed: int = 0,
         truth: TuningQueries | None = None, give_up_ms: float | None = None, rerank: int = 0,
         at_least: int | None = None) -> dict:
    """The smallest nprobe / efSearch whose recall@k against exact search reaches `target` (its lower
    95% bound does), on up to `n_queries` gallery vectors (from `held_out` rows, those the index was
    not trained on, when given; or the queries of `truth`) searching for their neighbours, themselves
    left out; sets it on the index and returns {"params", "recall_at_10", "recall_at_10_lower",
    "target", "queries", "items", "ms_per_query"} (the last: its search of the tuning queries). With
    `give_up_ms`, it stops (adding "gave_up": True) at a setting below the target whose search takes
    longer per query than that: a larger one only takes longer. Lossy codes stop short of the target at a
    doubled setting that gains less than PLATEAU of recall (their ceiling: the rest would only scan more of
    the index for nothing). With `rerank` R, each search re-scores
    a shortlist of R x max(k, TUNE_K) with the float `vectors` (`reranked`), and "recall_at_10_raw" is
    the recall at the setting found without that. `at_least`: a setting below which none can meet the target
    (a longer shortlist's: a shorter one finds no more at any setting), where the search begins."""
    info = describe(index)
    result = {"params": {}, "recall_at_10": 1.0, "target": target, "queries": 0, "items": len(vectors)}
    if info["exact"] or len(vectors) < 2:
        return result
    truth = truth or tuning_queries(vectors, ids, held_out, k=k, n_queries=n_queries, seed=seed)
    rows, queries, query_ids, exact = truth.rows, truth.queries, truth.query_ids, truth.exact
    fetch = vectors_by_id(vectors, ids) if rerank else None

    def found_at(with_rerank: int) -> np.ndarray:
        if with_rerank:
            return reranked(index, queries, k + 1, with_rerank, fetch)[1]
        return index.search(queries, k + 1)[1]

    def recall_at(value: int | None) -> tuple[float, float, float]:
        """Mean recall, its lower 95% bound (mean - 2 standard errors: the bound must reach the target,
        so that the setting holds on other queries too, not just on this sample) and ms per query."""
        if value is not None:
            set_param(index, info["param"], value)
        start = time.perf_counter()
        found = found_at(rerank)
        ms = 1e3 * (time.perf_counter() - start) / len(queries)
        r = recalls_without_self(found, exact, query_ids, k)
        return float(r.mean()), float(r.mean() - 2 * r.std() / np.sqrt(len(r))), ms

    result["queries"] = len(rows)
    if info["param"] is None:
        r = recall_at(None)
        result.update(recall_at_10=round(r[0], 4), ms_per_query=round(r[2], 5))
        return result
    ivf = faiss.try_extract_index_ivf(index)
    low, high = (1, ivf.nlist) if ivf is not None else (k, 4096)
    low = min(max(low, at_least or low), high)
    value, best, lo, before = low, None, low, None
    while True:
        r = recall_at(value)
        ceiling = info["lossy"] and before is not None and r[0] - before < PLATEAU
        if r[1] >= target or value >= high or ceiling:
            best = (value, r)
            break
        if give_up_ms is not None and r[2] > give_up_ms:
            result.update(params={info["param"]: value}, recall_at_10=round(r[0], 4), recall_at_10_lower=round(r[1], 4),
                          ms_per_query=round(r[2], 5), gave_up=True)
            return result
        lo, value, before = value, min(high, value * 2), r[0]
    while best[1][1] >= target and best[0] - lo > 1:  # bisect between the last failing and first passing
        mid = (lo + best[0]) // 2
        r = recall_at(mid)
        best, lo = ((mid, r), lo) if r[1] >= target else (best, mid)
    set_param(index, info["param"], best[0])
    result.update(params={info["param"]: best[0]}, recall_at_10=round(best[1][0], 4),
                  recall_at_10_lower=round(best[1][1], 4), ms_per_query=round(best[1][2], 5))
    if rerank:
        result["recall_at_10_raw"] = round(float(recalls_without_self(found_at(0), exact, query_ids, k).mean()), 4)
    if best[1][1] < target:
        log.warning("faiss: %s reaches recall@%d %.3f at most (%s=%d), below the target %.2f",
                    type(_inner(index)[0]).__name__, k, best[1][0], info["param"], best[0], target)
    return result


def search_params(info: dict, params: dict, selector: faiss.IDSelector | None) -> faiss.SearchParameters | None:
    """faiss search parameters carrying an id selector and the tuned nprobe / efSearch (None: no selector)."""
    if selector is None:
        return None
    if info["param"] == "nprobe":
        return faiss.SearchParametersIVF(sel=selector, nprobe=int(params.get("nprobe", 1)))
    if info["param"] == "efSearch":
        return faiss.SearchParametersHNSW(sel=selector, efSearch=int(params.get("efSearch", 16)))
    return faiss.SearchParameters(sel=selector)


def shortlist(k: int, rerank: int) -> int:
    """How many a search through lossy codes takes for `rerank` R to return k re-scored: R x max(k, TUNE_K)
    (so a small k keeps the shortlist the recall target was tuned with)."""
    return max(k, rerank * max(k, TUNE_K))


def vectors_by_id(vectors: np.ndarray, ids: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A `fetch` for `rescored` over an array: the rows of `vectors` under the given `ids`."""
    order = np.argsort(ids, kind="stable")
    known = ids[order]
    return lambda wanted: vectors[order[np.searchsorted(known, wanted)]]


def rescored(queries: np.ndarray, candidates: np.ndarray, fetch: Callable[[np.ndarray], np.ndarray],
             k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) of each query's k nearest among its row of `candidates` (ids; -1: none) by exact inner
    product with the float vectors `fetch(sorted unique ids)` returns (one row per id, in that order; NaN: an id
    to drop); only those vectors are read, RERANK_CHUNK queries' at a time. Rows with fewer than k candidates end
    in id -1."""
    width = min(k, candidates.shape[1])
    scores = np.full((len(queries), k), np.finfo(np.float32).min, np.float32)
    found = np.full((len(queries), k), -1, np.int64)
    for start in range(0, len(queries), RERANK_CHUNK):
        part = slice(start, start + RERANK_CHUNK)
        valid = candidates[part] >= 0
        unique, where = np.unique(candidates[part][valid], return_inverse=True)
        vectors = fetch(unique) if len(unique) else np.zeros((0, queries.shape[1]), np.float32)
        rows = np.zeros(valid.shape, np.int64)
        rows[valid] = where
        exact = np.matmul(vectors[rows], queries[part, :, None])[..., 0] if len(unique) else np.zeros(valid.shape)
        kept = valid & np.isfinite(exact)
        exact[~kept] = -np.inf
        top = np.argsort(-exact, axis=1, kind="stable")[:, :width]
        scores[part, :width] = np.take_along_axis(exact, top, 1).clip(np.finfo(np.float32).min)
        found[part, :width] = np.where(np.take_along_axis(kept, top, 1), np.take_along_axis(candidates[part], top, 1),
                                       -1)
    return scores, found


def reranked(index: faiss.Index, queries: np.ndarray, k: int, rerank: int, fetch: Callable[[np.ndarray], np.ndarray],
             params: faiss.SearchParameters | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest of each query through an index of lossy codes: its `shortlist` by the codes, re-scored
    exactly with the float vectors `fetch` returns (`rescored`)."""
    candidates = index.search(queries, shortlist(k, rerank), params=params)[1]
    return rescored(queries, candidates, fetch, k)


def index_ids(index: faiss.Index) -> np.ndarray:
    """Every id an index holds (sorted)."""
    outer = faiss.downcast_index(index)
    if isinstance(outer, (faiss.IndexIDMap, faiss.IndexIDMap2)):
        return np.sort(faiss.vector_to_array(outer.id_map).astype(np.int64))
    ivf = faiss.extract_index_ivf(index)
    lists = ivf.invlists
    parts = [faiss.rev_swig_ptr(lists.get_ids(i), lists.list_size(i)).copy()
             for i in range(ivf.nlist) if lists.list_size(i)]
    return np.sort(np.concatenate(parts).astype(np.int64)) if parts else np.zeros(0, np.int64)


def __getattr__(name: str) -> Callable:
    """`build_index`: the deprecated name of `index_from_factory`, until 0.2 (`metricsearch.index.build_index` is
    the automatic index)."""
    if name != "build_index":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn("metricsearch.index.faiss_index.build_index is deprecated and goes in 0.2: call "
                  "index_from_factory", DeprecationWarning, stacklevel=2)
    return index_from_factory
