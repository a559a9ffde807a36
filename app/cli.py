"""The `metricsearch` command line: train, export, evaluate, and list what is available."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np


def _cmd_train(args: argparse.Namespace) -> int:
    from metricsearch.train.config import load_config
    from metricsearch.train.trainer import train

    overrides = list(args.set or [])
    for key in ("device", "name", "output_dir", "epochs"):
        if getattr(args, key) is not None:
            overrides.append(f"{key}={getattr(args, key)}")
    if args.pretrained is not None:
        overrides.append(f"model.pretrained={args.pretrained}")
    config = load_config(args.config, overrides)
    result = train(config, resume=args.resume, overwrite=args.overwrite, progress=not args.quiet,
                   stop_after_epoch=args.stop_after_epoch)
    summary = {"run_dir": str(result.run_dir), "epochs": result.epochs,
               "best_recall_at_1": result.best_recall_at_1, "last": result.last_metrics}
    print(json.dumps(summary, indent=None if args.quiet else 2))
    return 0


def _sample_batch(model_pre, images, n: int) -> np.ndarray:
    """n images spread evenly over an ImageSet, preprocessed."""
    idx = np.linspace(0, len(images) - 1, num=min(n, len(images))).round().astype(int)
    return model_pre.batch([images.load(int(i)) for i in idx])


def _run_split(saved: dict, dataset: str | None):
    """The data split of a run's saved config, or of `dataset` when one is given."""
    from metricsearch.train.data import load_split

    spec = dataset or saved.get("dataset")
    if not spec:
        raise ValueError("the checkpoint names no data set: pass --dataset SPEC")
    return load_split(spec, split_classes=None if dataset else saved.get("split_classes"))


def _cmd_export(args: argparse.Namespace) -> int:
    from metricsearch.models.embedder import load_checkpoint, resolve_checkpoint
    from metricsearch.train.export import export_onnx

    model, state = load_checkpoint(args.checkpoint)
    split = _run_split(state.get("config", {}), args.dataset)
    batch = _sample_batch(model.preprocessing, split.test, args.batch_size)
    report = export_onnx(model, args.out, batch, source=str(resolve_checkpoint(args.checkpoint)),
                         opset=args.opset, atol=args.atol)
    print(json.dumps({"onnx": str(report.path), "max_abs_diff": report.max_abs_diff,
                      "parity_batch": report.batch_size, "embedding_dim": model.dim}))
    return 0


def _aligned_sets(query_spec: str, gallery_spec: str):
    """Query and gallery ImageSets whose labels agree by class name."""
    from metricsearch.train.data import load_image_set

    q, g = load_image_set(query_spec), load_image_set(gallery_spec)
    names = sorted(set(q.class_names) | set(g.class_names))
    index = {n: i for i, n in enumerate(names)}
    q_labels = np.array([index[q.class_names[l]] for l in q.labels], dtype=np.int64)
    g_labels = np.array([index[g.class_names[l]] for l in g.labels], dtype=np.int64)
    return q, q_labels, g, g_labels


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from metricsearch.models.onnx_embedder import OnnxEmbedder
    from metricsearch.models.pixels import PixelEmbedder
    from metricsearch.train.data import load_split
    from metricsearch.train.dataset import embed_image_set
    from metricsearch.train.evaluation import evaluate, evaluate_split

    if args.model == "pixels":
        embedder = PixelEmbedder(args.pixels_size, args.pixels_channels)
    else:
        embedder = OnnxEmbedder(args.model, device=args.device)

    def embed(images) -> np.ndarray:
        return embed_image_set(lambda x: embedder.embed_arrays(x.numpy()), images, embedder.preprocessing,
                               args.batch_size, progress=not args.json, desc="embedding")

    if (args.query is None) != (args.gallery is None):
        raise ValueError("--query and --gallery go together")
    if args.query is not None:
        q, ql, g, gl = _aligned_sets(args.query, args.gallery)
        recall_k = args.recall_k or (1, 10, 20, 30, 40, 50)
        result = evaluate(embed(q), ql, embed(g), gl, recall_k, not args.no_nmi)
    else:
        if not args.dataset:
            raise ValueError("pass --dataset SPEC, or --query SPEC --gallery SPEC")
        split = load_split(args.dataset, split_classes=args.split_classes)
        for note in split.notes:
            print(f"data: {note}", file=sys.stderr)
        result = evaluate_split(embed, split, args.recall_k, not args.no_nmi, args.one_shot_ways)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result["recall_at_k"].items():
            print(f"Recall@{k:<5} {v:.4f}")
        if result["nmi"] is not None:
            print(f"NMI          {result['nmi']:.4f}")
        print(f"MAP@R        {result['map_at_r']:.4f}\nqueries      {result['n_queries']}")
        for key in (k for k in result if k.startswith("one_shot")):
            print(f"{key:<12} {result[key]:.4f}")
    return 0


def _cmd_datasets(args: argparse.Namespace) -> int:
    from metricsearch.train.data import adapters

    for spec, text in adapters():
        print(f"{spec:<18} {text}")
    return 0


def _print_registry(title: str, registry, hidden: tuple[str, ...] = ()) -> None:
    import inspect

    print(f"{title}:")
    for name in registry.names():
        params = ", ".join(
            f"{k}={v!r}" if v is not inspect.Parameter.empty else k
            for k, v in registry.parameters(name).items()
            if k not in ("labels", "class_counts", "num_classes", "num_images", "sampler", *hidden)
        )
        print(f"  {name:<22} {registry.describe(name)}")
        if params:
            print(f"  {'':<22} ({params})")


def _cmd_losses(args: argparse.Namespace) -> int:
    from metricsearch.train.losses import LOSSES

    _print_registry("losses (loss.name=...)", LOSSES)
    return 0


def _cmd_samplers(args: argparse.Namespace) -> int:
    from metricsearch.train.sampling import MINERS, SAMPLERS, WEIGHTINGS

    _print_registry("samplers (sampler.name=...)", SAMPLERS, ("seed", "rank", "world_size", "batches_per_epoch"))
    _print_registry("miners (miner.name=...)", MINERS)
    _print_registry("weightings (weighting.name=...)", WEIGHTINGS)
    return 0


def _cmd_inspect_loss(args: argparse.Namespace) -> int:
    import torch

    from metricsearch.train import losses
    from metricsearch.train.losses.inspect import plot_pair_weights, random_batch

    if args.checkpoint:
        from metricsearch.models.embedder import load_checkpoint
        from metricsearch.train.dataset import embed_image_set
        from metricsearch.train.sampling import build_sampler

        model, state = load_checkpoint(args.checkpoint)
        split = _run_split(state.get("config", {}), args.dataset)
        sampler = build_sampler("group", split.test.labels, classes_per_batch=args.classes,
                                images_per_class=args.per_class, seed=args.seed)
        batch = split.test.subset(next(iter(sampler)))
        with torch.no_grad():
            embeddings = torch.from_numpy(embed_image_set(model, batch, model.preprocessing))
        labels = torch.as_tensor(batch.labels)
    else:
        embeddings, labels = random_batch(args.classes, args.per_class, args.dim, args.seed)
    stats = {"class_counts": {int(c): int((labels == c).sum()) for c in labels.unique()},
             "num_classes": int(labels.max()) + 1}
    built = {name: losses.build(name, **stats) for name in args.loss}
    out = plot_pair_weights(built, embeddings, labels, args.out)
    print(out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command."""
    fmt = argparse.ArgumentDefaultsHelpFormatter
    parser = argparse.ArgumentParser(
        prog="metricsearch", formatter_class=fmt,
        description="Train an image embedding with deep metric learning, export it to ONNX, evaluate it.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=fmt)
        p.set_defaults(func=func)
        return p

    p = add("train", _cmd_train, "Train an embedder from a YAML config; writes OUTPUT_DIR/NAME/ "
            "(config.yaml, metrics.jsonl, last.pt, best.pt, training.png).")
    p.add_argument("--config", help="YAML config (see configs/); without it the built-in digits default runs")
    p.add_argument("--set", action="extend", nargs="+", metavar="KEY=VALUE",
                   help="override config values, dotted keys, YAML values, applied in order (e.g. --set "
                        "sampler.name=p_random sampler.p=0.1 weighting.name=importance); repeatable")
    p.add_argument("--resume", action="store_true", help="continue the run from its last.pt")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run of the same name")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="where to train (config key device)")
    p.add_argument("--name", help="run name (config key name)")
    p.add_argument("--output-dir", dest="output_dir", help="parent folder of runs (config key output_dir)")
    p.add_argument("--epochs", type=int, help="number of epochs (config key epochs)")
    p.add_argument("--pretrained", help="backbone weights: `imagenet` (torchvision weights from the local torch "
                   "cache; never downloaded) or a weights file (config key model.pretrained)")
    p.add_argument("--stop-after-epoch", type=int, help="pause after this epoch; continue later with --resume")
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-epoch lines")

    p = add("export", _cmd_export, "Export a trained embedder to ONNX (dynamic batch, preprocessing in the "
            "metadata) and check torch/onnxruntime parity on a real batch.")
    p.add_argument("checkpoint", help="run directory (uses best.pt, else last.pt) or a checkpoint file")
    p.add_argument("--out", required=True, help="path of the .onnx file to write")
    p.add_argument("--dataset", help="data set spec for the parity batch (default: the run's data set)")
    p.add_argument("--batch-size", type=int, default=32, help="images in the parity batch")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset version")
    p.add_argument("--atol", type=float, default=1e-4, help="largest allowed |torch - onnxruntime|")

    p = add("evaluate", _cmd_evaluate, "Recall@K, NMI and MAP@R of an ONNX model (or raw pixels) on a data "
            "set's test classes, or of queries against a gallery.")
    p.add_argument("--model", required=True, help="exported .onnx file, or `pixels` for the raw-pixel baseline")
    p.add_argument("--dataset", help="data set spec (see `metricsearch datasets`)")
    p.add_argument("--split-classes", type=float, help="for folder: specs without train/test sub-folders")
    p.add_argument("--query", help="folder: spec of query images (with --gallery; queries search the gallery only)")
    p.add_argument("--gallery", help="folder: spec of gallery images")
    p.add_argument("--recall-k", type=int, nargs="+", help="K values for Recall@K (default: the data set's)")
    p.add_argument("--no-nmi", action="store_true", help="skip NMI (k-means is slow on very many classes)")
    p.add_argument("--one-shot-ways", type=int, help="also report N-way one-shot accuracy over 1000 random "
                   "episodes of the test classes (Omniglot protocol: 20)")
    p.add_argument("--batch-size", type=int, default=256, help="images per inference batch")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="onnxruntime device")
    p.add_argument("--pixels-size", type=int, default=28, help="side of the resized image for --model pixels")
    p.add_argument("--pixels-channels", type=int, default=1, choices=[1, 3], help="channels for --model pixels")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: recall_at_k, nmi, map_at_r, n_queries")

    add("datasets", _cmd_datasets, "List the data set adapters and their spec strings.")
    add("losses", _cmd_losses, "List every loss with its parameters and defaults.")
    add("samplers", _cmd_samplers, "List the batch samplers, miners and pair weightings with their parameters.")

    p = add("inspect-loss", _cmd_inspect_loss, "Plot each loss's pair weights |dL/dS_ij| against similarity "
            "for one batch (General Pair Weighting): positives and negatives in two colours.")
    p.add_argument("--loss", action="append", required=True, help="loss name; repeat for one panel per loss")
    p.add_argument("--checkpoint", help="run directory or checkpoint: use its embeddings of a test batch")
    p.add_argument("--dataset", help="data set for --checkpoint (default: the run's)")
    p.add_argument("--out", default="pair_weights.png", help="PNG to write")
    p.add_argument("--classes", type=int, default=8, help="classes in the batch")
    p.add_argument("--per-class", type=int, default=8, help="images per class in the batch")
    p.add_argument("--dim", type=int, default=64, help="embedding dimension of a random batch")
    p.add_argument("--seed", type=int, default=0, help="seed of the batch")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `metricsearch` console script."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"metricsearch {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = "; the last finished epoch is in last.pt: run the same command with --resume" if args.command == "train" else ""
        print(f"metricsearch {args.command}: interrupted{hint}", file=sys.stderr)
        return 130


