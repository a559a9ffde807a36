"""The gallery commands of the command line: `metricsearch index build|add|remove|info|verify|rebuild`
and `metricsearch search`; each calls one public function of metricsearch.index."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from metricsearch.models.device import DEVICES
from metricsearch.models.memory_budget import memory_gb

DEVICE_HELP = "auto: CUDA for onnxruntime and GPUs for faiss when they are there; cpu or cuda to force"


def _print_summary(summary, as_json: bool) -> None:
    d = summary.to_dict()
    if as_json:
        print(json.dumps(d))
        return
    s = d["seconds"]
    print(f"indexed {d['indexed']}, skipped as exact duplicate {d['duplicates']}, failed {d['failed']} "
          f"(the gallery holds {d['count']} item{'' if d['count'] == 1 else 's'})")
    print(f"seconds: read {s['read']} (summed over the decoding threads), embed {s['embed']}, write {s['write']}, "
          f"index {s['index']}, total {s['total']}; {d['images_per_s']} images/s")
    print(f"device: onnxruntime {d['device']['onnxruntime']}, faiss {d['device']['faiss']}")
    if d["index"]:
        print(f"index: {d['index']['factory']} ({d['index']['reason']}), search parameters {d['index']['params']}")
    for note in d["notes"]:
        print(f"note: {note}")
    print(f"report (every failed file and why): {d['report']}")


def _index_options(args: argparse.Namespace) -> dict:
    """The IndexOptions fields that `index build` and `index add` share, from their arguments."""
    return {"part": args.part, "batch_size": args.batch, "memory": memory_gb(args.memory), "workers": args.workers,
            "device": args.device,
            "progress": not args.json, "engine": args.engine, "ray_address": args.ray_address,
            "ray_actors": args.ray_actors}


def _build(args: argparse.Namespace) -> int:
    from metricsearch.index import BuildOptions, build_gallery

    options = BuildOptions(**_index_options(args), index=args.index, resume=args.resume, overwrite=args.overwrite,
                           thumbnail_size=0 if args.no_thumbnails else args.thumbnail_size,
                           max_pixels=args.max_pixels, min_side=args.min_side, ray_shards=args.ray_shards,
                           index_memory=None if args.index_memory is None else int(args.index_memory * 2**30))
    _print_summary(build_gallery(args.model, args.images, args.db, options), args.json)
    return 0


def _add(args: argparse.Namespace) -> int:
    from metricsearch.index import IndexOptions, add_images

    summary = add_images(args.db, args.images, IndexOptions(**_index_options(args)), model=args.model)
    _print_summary(summary, args.json)
    return 0


def _remove(args: argparse.Namespace) -> int:
    from metricsearch.index import remove_items

    result = remove_items(args.db, ids=args.ids, label=args.label)
    print(json.dumps(result) if args.json else f"removed {result['removed']} item(s); {result['count']} left")
    return 0


def _print_info(info: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(info))
        return
    for key, value in info.items():
        print(f"{key:<24} {json.dumps(value) if isinstance(value, (dict, list)) else value}")


def _info(args: argparse.Namespace) -> int:
    from metricsearch.index import gallery_info

    _print_info(gallery_info(args.db, device=args.device), args.json)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from metricsearch.index import verify_gallery

    result = verify_gallery(args.db)
    if args.json:
        print(json.dumps(result))
    else:
        for note in result["notes"]:
            print(f"note: {note}")
        if result["ok"]:
            print(f"ok: LMDB and faiss agree on {result['count']} ids; the model matches its fingerprint")
    for problem in result["problems"]:
        print(f"metricsearch index verify: {args.db}: {problem}", file=sys.stderr)
    return 0 if result["ok"] else 1


def _rebuild(args: argparse.Namespace) -> int:
    from metricsearch.index import rebuild_index

    _print_info(rebuild_index(args.db, index=args.index, device=args.device), args.json)
    return 0


def _duplicates(args: argparse.Namespace) -> int:
    from metricsearch.index import draw_duplicates, find_duplicates

    groups = find_duplicates(args.db, args.threshold)
    if args.report:
        print(f"report: {draw_duplicates(args.db, groups, args.report)}", file=sys.stderr)
    if args.json:
        print(json.dumps(groups))
        return 0
    for n, group in enumerate(groups, start=1):
        print(f"group {n}: {group['size']} items, lowest similarity {group['min_similarity']}")
        for item in group["items"]:
            print(f"  id {item['id']:<8} label {item['label'] or '-'}  {item['path']}")
    print(f"{len(groups)} group(s) of near-duplicates at cosine >= {args.threshold}")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    """`metricsearch search`: the nearest gallery items of one query image."""
    from metricsearch.index import Gallery

    with Gallery.open(args.db, model=args.model, device=args.device, mmap=args.mmap or None) as gallery:
        hits = gallery.search([args.image], k=args.k, label=args.label)[0]
    if args.json:
        print(json.dumps(hits.to_list()))
        return 0
    for rank, hit in enumerate(hits, start=1):
        print(f"{rank:>3}  id {hit.id:<8} score {hit.score:.4f}  label {hit.label or '-'}  {hit.path}")
    return 0


def add_index_commands(sub, add: Callable[..., argparse.ArgumentParser]) -> None:
    """Register `index` (with its sub-commands) and `search` on the top-level sub-parsers."""
    index = add("index", lambda args: args.index_func(args),
                "Build and maintain a searchable gallery (LMDB + faiss) of a model's embeddings of your images.")
    inner = index.add_subparsers(dest="index_command", required=True, metavar="INDEX_COMMAND",
                                 help="build, add, remove, info, rebuild, verify or duplicates (each has --help)")

    def sub_add(name: str, func, help_text: str) -> argparse.ArgumentParser:
        p = inner.add_parser(name, help=help_text, description=help_text, formatter_class=index.formatter_class)
        p.set_defaults(index_func=func)
        p.add_argument("--db", required=True, help="the gallery folder")
        return p

    def images(p: argparse.ArgumentParser) -> None:
        p.add_argument("--images", required=True, help="data set spec: folder:PATH (labels from sub-folders), "
                       "files:PATH (every image below, no labels), csv:FILE (columns path, label), or any adapter")
        p.add_argument("--part", "--split", dest="part", choices=["train", "test"],
                       help="only this part of a split spec (default: all; --split is its old name)")
        p.add_argument("--batch", type=int, help="images per inference batch and per LMDB transaction (default: the "
                       "largest, at most 64 on a CPU and 256 on a GPU, that keeps the job within --memory)")
        p.add_argument("--memory", default="2", metavar="GB", help="the job's peak memory budget in GB, which "
                       "chooses the batch (default: 2)")
        p.add_argument("--workers", type=int, help="decoding threads (default: one per core, at most 8)")
        p.add_argument("--device", choices=DEVICES, default="auto", help=DEVICE_HELP)
        p.add_argument("--json", action="store_true", help="print the summary as one JSON object, no progress bar")
        p.add_argument("--engine", choices=["local", "ray"], default="local", help="where images are read and "
                       "embedded: local threads, or a Ray cluster (needs the `scale` extra); one writer here "
                       "either way")
        p.add_argument("--ray-address", help="the Ray cluster to use with --engine ray (default: start a local one)")
        p.add_argument("--ray-actors", type=int, help="embedding actors with --engine ray (default: one per GPU of "
                       "the cluster, else half its CPUs)")

    p = sub_add("build", _build, "Index every image of a spec into a new gallery; prints indexed / duplicate / "
                "failed counts and seconds per stage, and writes DIR/report.json with each failed file and why.")
    p.add_argument("--model", required=True, help="the exported .onnx embedder")
    images(p)
    p.add_argument("--index", help="auto (builds the candidates that fit in memory: IVF-Flat, IVF with an HNSW "
                   "quantizer for large galleries, HNSW, exact search for small ones, compressed codes when memory "
                   "is short; tunes each to recall@10 0.95, times each, keeps the simplest within 15%% of the "
                   "fastest in CPU time; exact search alone for vectors of 24 MiB or less), flat, ivf, ivfpq, hnsw, "
                   "or a faiss factory string (default: auto); with --resume, replaces the request of an unfinished "
                   "build")
    p.add_argument("--index-memory", type=float, metavar="GB", help="memory the faiss index build may use: with "
                   "--index auto the index takes at most half, and when no float index fits, compressed codes "
                   "(IVF-SQ8, IVF-PQ, OPQ + IVF-PQ) that re-rank a shortlist with the stored vectors (default: the "
                   "memory available)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted build where its committed work ends")
    p.add_argument("--overwrite", action="store_true", help="replace a gallery that is already in --db")
    p.add_argument("--ray-shards", type=int, help="with --engine ray, Ray tasks that each add a shard of the vectors "
                   "to an IVF index trained once here, their inverted lists merged here (default: one per CPU of a "
                   "cluster of several machines from 1,000,000 items, else none; 1: none); flat and HNSW are built "
                   "here")
    p.add_argument("--thumbnail-size", type=int, default=256, help="long side of the stored thumbnails, in pixels")
    p.add_argument("--no-thumbnails", action="store_true", help="store no thumbnails")
    p.add_argument("--max-pixels", type=int, default=64_000_000, help="larger images are refused (decompression bombs)")
    p.add_argument("--min-side", type=int, default=8, help="images with a shorter side are refused")

    p = sub_add("add", _add, "Add the images of a spec to a gallery (images it holds already are skipped).")
    images(p)
    p.add_argument("--model", help="refuse unless this .onnx file is the gallery's model")

    p = sub_add("remove", _remove, "Remove items by id or by label.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--ids", type=int, nargs="+", help="item ids to remove")
    which.add_argument("--label", help="remove every item with this label")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    for name, func, text in (("info", _info,
                              "Model, dimension, count, index type and search parameters, size on disk."),
                             ("rebuild", _rebuild, "Build the faiss index again from the stored embeddings (drops "
                              "removed ids an HNSW index still holds; --index changes its type).")):
        p = sub_add(name, func, text)
        p.add_argument("--device", choices=DEVICES, default="auto", help=DEVICE_HELP)
        p.add_argument("--json", action="store_true",
                       help="print one JSON object (keys include count, dim, index_type)")
        if name == "rebuild":
            p.add_argument("--index", help="index type for the new index (default: the one asked for at build)")

    p = sub_add("verify", _verify, "Check that LMDB and faiss agree on ids and count and that the model matches its "
                "stored fingerprint; exits 1 and says what disagrees otherwise.")
    p.add_argument("--json", action="store_true", help="print {ok, problems, notes, count, ...} as JSON")

    p = sub_add("duplicates", _duplicates, "Groups of near-duplicate items (resized, re-encoded, cropped or lightly "
                "edited copies): pairs at cosine similarity >= --threshold, joined transitively, largest group first.")
    p.add_argument("--threshold", type=float, default=0.95, help="lowest cosine similarity of a duplicate pair")
    p.add_argument("--json", action="store_true", help='print a JSON list of {"size", "min_similarity", "items": '
                   '[{"id", "label", "path"}]}')
    p.add_argument("--report", metavar="DIR", help="also draw each group's thumbnails into DIR/duplicates.png")

    p = add("search", cmd_search, "Search a gallery with one image: its nearest items, nearest first.")
    p.add_argument("--db", required=True, help="the gallery folder")
    p.add_argument("--image", required=True, help="the query image file")
    p.add_argument("-k", type=int, default=10, help="how many items to return (at most the gallery's item count)")
    p.add_argument("--label", help="only items with this label")
    p.add_argument("--mmap", action="store_true", help="memory-map the faiss index from its file instead of loading "
                   "it (default: when the file is larger than half the memory available)")
    p.add_argument("--model", help="refuse unless this .onnx file is the gallery's model")
    p.add_argument("--device", choices=DEVICES, default="auto", help=DEVICE_HELP)
    p.add_argument("--json", action="store_true", help='print a JSON list of {"id", "score", "label", "path"}')
