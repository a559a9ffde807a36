"""Gallery indexing speed: `index build` end to end against the embedder alone, search latency of
Gallery.search against raw faiss on the same index, flat against `auto` at 1M vectors, bytes per item.

    python bench/gallery_speed.py                                # everything (5.5 minutes on 2 idle CPU cores)
    python bench/gallery_speed.py --skip-build --sizes 100000    # search only, at 100k only

Needs the `train` extra (torch, torchvision, onnx) to export the two benchmark models. Writes a
markdown table to stdout and bench/results/gallery_speed.md, and the raw numbers to
bench/results/gallery_speed.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from metricsearch.index import Gallery, build_gallery, rebuild_index
from metricsearch.index.faiss_index import recall_without_self
from metricsearch.index.jobs import _create, build_faiss
from metricsearch.index.lmdb_store import Store
from metricsearch.index.pipeline import ImageReader, ReadItem, ReadSettings, source_names
from metricsearch.index.writer import GalleryWriter
from metricsearch.models import OnnxEmbedder, Preprocessing, ordered_batches, preprocessed_batches
from metricsearch.data import load_image_set

RESULTS = Path(__file__).with_name("results")


def export_model(backbone: str, size: int, channels: int, out: Path) -> Path:
    """An untrained embedder (128-d) exported to ONNX: speed does not depend on the weights."""
    import torch

    from metricsearch.models.torch_embedder import Embedder
    from metricsearch.train import export_onnx

    torch.manual_seed(0)
    mean, std = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)) if channels == 3 else ((0.5,), (0.5,))
    pre = Preprocessing(size=size, channels=channels, mean=mean, std=std,
                        resize="shorter_center_crop" if channels == 3 else "stretch")
    model = Embedder(backbone=backbone, dim=128, preprocessing=pre)
    batch = np.random.default_rng(0).normal(size=(2, channels, size, size)).astype(np.float32)
    return export_onnx(model, out, batch).path


def write_photos(folder: Path, n: int, size: tuple[int, int] = (1280, 960)) -> Path:
    """n distinct JPEG 'photos' of `size` (width, height): smooth colour fields with shapes and grain."""
    folder.mkdir(parents=True, exist_ok=True)
    width, height = size
    for i in range(n):
        rng = np.random.default_rng(i)
        base = Image.fromarray(rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)).resize(size, Image.BICUBIC)
        draw = ImageDraw.Draw(base)
        for _ in range(6):
            x, y = rng.integers(0, width * 15 // 16), rng.integers(0, height * 11 // 12)
            w, h = rng.integers(width // 32, width // 3, size=2)
            draw.ellipse([x, y, x + w, y + h], fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
        grain = rng.normal(0, 6, (height, width, 3))
        photo = np.clip(np.asarray(base.filter(ImageFilter.GaussianBlur(1)), float) + grain, 0, 255).astype(np.uint8)
        Image.fromarray(photo).save(folder / f"{i:06d}.jpg", quality=90)
    return folder


def embed_only(model: Path, images: str, batch: int) -> float:
    """Images/s of OnnxEmbedder.embed_arrays on batches decoded and preprocessed beforehand."""
    embedder = OnnxEmbedder(model, "cpu")
    batches = [b for _, b in preprocessed_batches(load_image_set(images), embedder.preprocessing, batch)]
    embedder.embed_arrays(batches[0][:2])  # warm-up
    start = time.perf_counter()
    for b in batches:
        embedder.embed_arrays(b)
    return sum(map(len, batches)) / (time.perf_counter() - start)


def read_only(model: Path, images: str, batch: int, thumbnail_size: int) -> float:
    """Images/s of the indexer's reader stage alone (read, hash, decode, preprocess, thumbnail) in
    its decoding threads, with nothing else running: the pace decoding allows."""
    image_set = load_image_set(images)
    reader = ImageReader(image_set, source_names(image_set, images), OnnxEmbedder(model, "cpu").preprocessing,
                         ReadSettings(thumbnail_size=thumbnail_size, mode=image_set.mode))
    start = time.perf_counter()
    count = sum(len(items) for _, items in ordered_batches(reader, len(image_set), batch, prefetch=1))
    return count / (time.perf_counter() - start)


def stored_bytes(db: Path) -> dict:
    """LMDB bytes in use and faiss file bytes, per item."""
    with Gallery.open(db) as gallery:
        info = gallery.info()
    size, count = info["size_bytes"], info["count"]
    return {"lmdb_per_item": size["lmdb"] / count, "faiss_per_item": size["faiss"] / count,
            "total_per_item": (size["lmdb"] + size["faiss"]) / count}


def bench_build(work: Path, name: str, model: Path, photos: Path, photo: str, batch: int,
                without_thumbnails: bool = False) -> list[dict]:
    rows = []
    for thumbnails in (True, False) if without_thumbnails else (True,):
        db = work / f"g_{name}_{photo}_{thumbnails}"
        before = embed_only(model, f"files:{photos}", batch)
        reader_rate = read_only(model, f"files:{photos}", batch, 256 if thumbnails else 0)
        start = time.perf_counter()
        summary = build_gallery(model, f"files:{photos}", db, batch_size=batch, device="cpu",
                                thumbnail_size=256 if thumbnails else 0)
        wall = time.perf_counter() - start
        embed_rate = (before + embed_only(model, f"files:{photos}", batch)) / 2  # before and after: the load drifts
        rows.append({"model": name, "photo": photo, "thumbnails": thumbnails, "images": summary.indexed, "batch": batch,
                     "embed_only_per_s": embed_rate,
                     "read_only_per_s": reader_rate, "pipeline_per_s": summary.images_per_s,
                     "end_to_end_per_s": summary.indexed / wall, "seconds": summary.seconds, **stored_bytes(db)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def clustered(n: int, clusters: int, dim: int = 128, draw: int = 0) -> np.ndarray:
    """Unit vectors like a trained embedding of many classes: around `clusters` random centres, each
    with its own spread, 0.3 to 0.9 per dimension against centres of norm ~11, i.e. a mean cosine
    between two members of a class of 0.55 to 0.92 (an Omniglot model of bench/omniglot_oneshot.py
    measures 0.56 to 0.91 per class on alphabets it never saw); `draw` takes another sample."""
    fixed = np.random.default_rng(12345)
    centres = fixed.normal(size=(clusters, dim)).astype(np.float32)
    spreads = fixed.uniform(0.3, 0.9, clusters).astype(np.float32)
    rng = np.random.default_rng(draw + 1)
    x = np.empty((n, dim), np.float32)
    for start in range(0, n, 100_000):  # in chunks: a few hundred MB at 1M, not gigabytes
        c = rng.integers(0, clusters, min(100_000, n - start))
        part = centres[c] + spreads[c, None] * rng.standard_normal((len(c), dim), dtype=np.float32)
        x[start:start + len(c)] = part / np.linalg.norm(part, axis=1, keepdims=True)
    return x


def synthetic_gallery(db: Path, vectors: np.ndarray, model: Path, chunk: int = 20_000, index: bool = True) -> None:
    """A gallery of precomputed vectors through the real writer and index stage (no images, no thumbnails);
    without `index`, its LMDB only (no faiss index yet)."""
    store = Store.open(db, writable=True)
    try:
        _create(store, db, model, OnnxEmbedder(model, "cpu"), ReadSettings(thumbnail_size=0), "auto", "synthetic", None)
        writer = GalleryWriter(store)
        for start in range(0, len(vectors), chunk):
            items = [ReadItem(i, f"synthetic/{i:07d}", f"c{i % 1000}", sha256=hashlib.sha256(b"%d" % i).digest(),
                              size=512) for i in range(start, min(start + chunk, len(vectors)))]
            writer.write_batch(items, vectors[start:start + chunk])
        if index:
            build_faiss(store, db, None, "cpu")
    finally:
        store.close()


def normalised_search(index: faiss.Index, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw faiss as a caller of cosine search writes it: the queries copied, normalised, searched."""
    x = np.array(x, dtype=np.float32)
    faiss.normalize_L2(x)
    return index.search(x, k)


def latency(gallery: Gallery, queries: np.ndarray, batch: int, rounds: int) -> dict:
    """Raw faiss (on the unit queries as given, and as a cosine-search caller writes it: copied and
    normalised first) and Gallery.search on the same index and queries, call by call in turn (which
    goes first rotates), so all see the same machine noise; overheads are ratios of median call
    times. Reading every hit out as a dict is timed afterwards on its own, so that its garbage
    cannot slow the calls compared."""
    raw = gallery._state.index
    calls = {"raw": lambda x: raw.search(x, 10), "raw_normalised": lambda x: normalised_search(raw, x, 10),
             "gallery": lambda x: gallery.search(x, 10),
             "gallery_hits": lambda x: [h.to_dict() for hits in gallery.search(x, 10) for h in hits]}
    times: dict[str, list[float]] = {key: [] for key in calls}
    compared = ["raw", "raw_normalised", "gallery"]
    xs = [np.ascontiguousarray(queries[(r * batch) % len(queries):][:batch]) for r in range(rounds)]
    for r, x in enumerate(xs):
        for key in compared[r % 3:] + compared[:r % 3]:
            start = time.perf_counter()
            calls[key](x)
            times[key].append(time.perf_counter() - start)
    for x in xs:
        start = time.perf_counter()
        calls["gallery_hits"](x)
        times["gallery_hits"].append(time.perf_counter() - start)
    out = {}
    for key, t in times.items():
        t = np.array(t[max(1, rounds // 20):])  # the first calls warm caches
        # QPS from the median call: this machine is shared, and the mean would mostly measure the others
        out[key] = {"p50_ms": 1e3 * np.median(t), "p99_ms": 1e3 * np.percentile(t, 99), "qps": batch / np.median(t)}
    out["overhead"] = out["raw"]["qps"] / out["gallery"]["qps"] - 1
    out["overhead_normalised"] = out["raw_normalised"]["qps"] / out["gallery"]["qps"] - 1
    return out


def recall_at_10(gallery: Gallery, vectors: np.ndarray, queries: np.ndarray, query_ids: np.ndarray) -> float:
    """Recall@10 of Gallery.search against exact search, each query's own id (if it has one) left out."""
    _, exact = faiss.knn(queries, vectors, 11, metric=faiss.METRIC_INNER_PRODUCT)
    found = np.stack([np.pad(h.ids, (0, 11 - len(h.ids)), constant_values=-1) for h in gallery.search(queries, 11)])
    return recall_without_self(found, exact, query_ids, 10)


def bench_search(work: Path, model: Path, n: int) -> dict:
    vectors = clustered(n, n // 50)
    db = work / f"vectors_{n}"
    start = time.perf_counter()
    synthetic_gallery(db, vectors, model)
    build_s = time.perf_counter() - start
    queries = clustered(4096, n // 50, draw=99)  # new vectors of the same distribution
    held_out = np.random.default_rng(5).choice(n, 2000, replace=False)  # gallery items querying the rest
    result = {"n": n, "build_s": build_s}
    for name in ("auto", "flat"):
        if name == "flat":
            rebuild_index(db, "flat", device="cpu")
        with Gallery.open(db, device="cpu") as gallery:
            info = gallery.info()
            result[name] = {"index": info["index_type"], "params": info["search_params"],
                            "recall_at_10": recall_at_10(gallery, vectors, vectors[held_out], held_out),
                            "recall_at_10_new": recall_at_10(gallery, vectors, queries[:2000], np.full(2000, -1)),
                            "batch_1": latency(gallery, queries, 1, 8000 if name == "auto" else 120),
                            "batch_256": latency(gallery, queries, 256,
                                                 (120 if n <= 200_000 else 40) if name == "auto" else 8)}
        print(json.dumps({"n": n, name: result[name]}), flush=True)
    return result


def table(builds: list[dict], searches: list[dict]) -> str:
    lines = ["| model | photos | images | batch | embed only (img/s) | reader only (img/s) | the two in turn (img/s) | "
             "`index build` pipeline (img/s) | end to end incl. index (img/s) | pipeline / embed only | "
             "pipeline / slower stage | pipeline / the two in turn | ceiling: the two in turn / embed only |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in builds:
        if r["thumbnails"]:
            embed, read, pipe = r["embed_only_per_s"], r["read_only_per_s"], r["pipeline_per_s"]
            in_turn = 1 / (1 / embed + 1 / read)  # no overlap at all: each stage in turn on all the cores
            lines.append(f"| {r['model']} | {r['photo']} | {r['images']} | {r['batch']} | {embed:.1f} | {read:.1f} | "
                         f"{in_turn:.1f} | {pipe:.1f} | {r['end_to_end_per_s']:.1f} | {pipe / embed:.0%} | "
                         f"{pipe / min(embed, read):.0%} | {pipe / in_turn:.0%} | {in_turn / embed:.0%} |")
    lines += ["", "| gallery | index | params | recall@10 vs exact: gallery items / new vectors | batch | "
              "raw faiss p50 / p99 (ms) | Gallery.search p50 / p99 (ms) | raw QPS | Gallery QPS | overhead over raw | "
              "overhead over raw + normalise | with hits read: QPS |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in searches:
        for name in ("auto", "flat"):
            r = s[name]
            for b in ("batch_1", "batch_256"):
                raw, gal, hits = r[b]["raw"], r[b]["gallery"], r[b]["gallery_hits"]
                lines.append(f"| {s['n']:,} | {r['index']} ({name}) | {r['params'] or '-'} | {r['recall_at_10']:.3f} / "
                             f"{r['recall_at_10_new']:.3f} | "
                             f"{b.split('_')[1]} | {raw['p50_ms']:.3f} / {raw['p99_ms']:.3f} | {gal['p50_ms']:.3f} / "
                             f"{gal['p99_ms']:.3f} | {raw['qps']:.0f} | {gal['qps']:.0f} | "
                             f"{r[b]['overhead']:+.1%} | {r[b]['overhead_normalised']:+.1%} | {hits['qps']:.0f} |")
        a, f = s["auto"]["batch_256"]["gallery"]["qps"], s["flat"]["batch_256"]["gallery"]["qps"]
        lines.append(f"| {s['n']:,} | auto / flat QPS at batch 256: **{a / f:.1f}x** | | | | | | | | | | |")
    lines += ["", "| model | photos | thumbnails | LMDB bytes / item | faiss bytes / item | total bytes / item |",
              "|---|---|---|---:|---:|---:|"]
    for r in builds:
        if r["model"] == "small_cnn":
            lines.append(f"| {r['model']} | {r['photo']} | {'256 px' if r['thumbnails'] else 'none'} | "
                         f"{r['lmdb_per_item']:.0f} | {r['faiss_per_item']:.0f} | {r['total_per_item']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=512, help="synthetic JPEGs to index, per photo size")
    parser.add_argument("--photo-sizes", nargs="+", default=["1280x960", "500x375"], metavar="WxH",
                        help="photo sizes (a phone photo shrunk; a catalogue or CUB-birds-sized image)")
    parser.add_argument("--batch", type=int, default=32, help="images per inference batch")
    parser.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000], help="synthetic gallery sizes")
    parser.add_argument("--skip-build", action="store_true", help="only the search part")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-gallery-speed-") as tmp:
        work = Path(tmp)
        small = export_model("small_cnn", 28, 1, work / "small_cnn.onnx")
        builds = []
        if not args.skip_build:
            r18 = export_model("resnet18", 224, 3, work / "r18.onnx")
            for i, photo in enumerate(args.photo_sizes):
                width, height = map(int, photo.split("x"))
                photos = write_photos(work / f"photos_{photo}", args.photos, (width, height))
                builds += bench_build(work, "resnet18", r18, photos, photo, args.batch)
                builds += bench_build(work, "small_cnn", small, photos, photo, args.batch, without_thumbnails=i == 0)
        searches = [bench_search(work, small, n) for n in args.sizes]
    text = table(builds, searches)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gallery_speed.md").write_text(text + "\n")
    (RESULTS / "gallery_speed.json").write_text(json.dumps({"builds": builds, "searches": searches}, indent=1,
                                                           default=float))


if __name__ == "__main__":
    main()
