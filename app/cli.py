"""The `metricsearch` command line: argument parsing, output formatting, and one public call per command."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, Sequence

from metricsearch.app.index_commands import add_index_commands
from metricsearch.data.folder import SplitClassesError
from metricsearch.errors import MetricsearchError
from metricsearch.models.device import DEVICES
from metricsearch.models.memory_budget import memory_gb


class HelpFormatter(argparse.HelpFormatter):
    """Help that shows an option's default only where it has one and the help text does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or action.default in (None, False, argparse.SUPPRESS)
                or "default" in text):
            return text
        return f"{text} (default: %(default)s)"


#: how each command that takes a class split fraction (split_classes) gives it, and drops it: the words of its
#: SplitClassesError (other commands have no option for it)
SPLIT_CLASSES_OPTIONS = {"train": ("--set split_classes=F", "pass --set split_classes=null"),
                         "evaluate": ("--split-classes F", "leave out --split-classes")}
TRAIN_EXTRA_HINT = "needs the `train` extra (torch, torchvision, onnx): pip install 'metricsearch[train]'"
REPORT_EXTRA_HINT = "--report needs the `report` extra (matplotlib, scikit-learn): pip install 'metricsearch[report]'"


def _cmd_train(args: argparse.Namespace) -> int:
    from metricsearch.train import RunExistsError, load_config, train

    overrides = list(args.set or [])
    for key in ("device", "name", "output_dir", "epochs"):
        if getattr(args, key) is not None:
            overrides.append(f"{key}={getattr(args, key)}")
    if args.pretrained is not None:
        overrides.append(f"model.pretrained={args.pretrained}")
    try:
        result = train(load_config(args.config, overrides), resume=args.resume, overwrite=args.overwrite,
                       progress=not args.quiet, stop_after_epoch=args.stop_after_epoch)
    except RunExistsError as exc:
        raise FileExistsError(f"{exc.run_dir} already holds a run; pass --resume to continue it, --overwrite to "
                              "replace it, or --set name=OTHER for a new run") from None
    if result.is_main:  # under torchrun, rank 0 speaks for the run
        summary = {"run_dir": str(result.run_dir), "epochs": result.epochs, "val_recall_at_1": result.val_recall_at_1,
                   "off_the_shelf": result.off_the_shelf, "test": result.test, "last": result.last_metrics}
        print(json.dumps(summary, indent=None if args.quiet else 2))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    if (args.checkpoint is None) == (args.backbone is None):
        raise ValueError("pass a run directory or checkpoint, or --backbone NAME (off-the-shelf features), "
                         "one of the two")
    if not args.dim and (args.fit_images or args.whiten_projection):
        raise ValueError("--fit-images and --whiten-projection go with --dim D")
    if args.dim and args.backbone is not None and args.fit_images is None:
        raise ValueError("--dim with --backbone needs --fit-images SPEC: the images to fit the projection on")
    projection = {"dim": args.dim, "whiten_projection": args.whiten_projection, "fit_images": args.fit_images}
    if args.backbone is not None:
        from metricsearch.train import export_pretrained

        if args.set:
            raise ValueError("--set changes a trained run's test-time views; off-the-shelf features (--backbone) "
                             "have none")

        report = export_pretrained(args.backbone, args.out, args.pretrained or "imagenet", images=args.dataset,
                                   batch_size=args.batch_size, opset=args.opset, atol=args.atol,
                                   overwrite=args.overwrite, **projection)
    else:
        from metricsearch.train import export_onnx
        from metricsearch.train.config import check_views

        if args.pretrained is not None:
            raise ValueError("--pretrained goes with --backbone; a checkpoint has its own weights")
        report = export_onnx(args.checkpoint, args.out, dataset=args.dataset, batch_size=args.batch_size,
                             opset=args.opset, atol=args.atol, overwrite=args.overwrite,
                             views=check_views(args.set or []), **projection)
    print(json.dumps({"onnx": str(report.path), "max_abs_diff": report.max_abs_diff,
                      "parity_batch": report.batch_size, "embedding_dim": report.embedding_dim}))
    return 0


def _cmd_quantize(args: argparse.Namespace) -> int:
    from metricsearch.train import quantize_onnx

    report = quantize_onnx(args.model, args.out, args.images, count=args.count, min_cosine=args.min_cosine,
                           full_range=args.full_range, overwrite=args.overwrite)
    print(json.dumps({"onnx": str(report.path), "calibration_images": report.calibration_images,
                      "min_cosine": round(report.min_cosine, 4), "mean_cosine": round(report.mean_cosine, 4)}))
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    if (args.model is None) == (args.db is None):
        raise ValueError("pass --model (with --dataset, or --query and --gallery) or --db (a gallery), one of the two")
    if args.db is not None and (args.center or args.expand_with):
        raise ValueError("--center and --expand-with go with --model (a gallery searches its own index): leave them "
                         "out with --db")
    if args.db is not None:
        from metricsearch.index import evaluate_gallery

        result = evaluate_gallery(args.db, recall_k=args.recall_k, with_nmi=not args.no_nmi, device=args.device,
                                  report=args.report)
    else:
        from metricsearch.evaluation import evaluate_model
        from metricsearch.models import open_embedder

        embedder = open_embedder(args.model, args.device, args.pixels_size, args.pixels_channels,
                                 memory=memory_gb(args.memory))
        result = evaluate_model(
            embedder, dataset=args.dataset, query=args.query, gallery=args.gallery, split_classes=args.split_classes,
            recall_k=args.recall_k, with_nmi=not args.no_nmi, one_shot_ways=args.one_shot_ways,
            one_shot_protocol=args.one_shot_protocol, center=args.center, expand_with=args.expand_with,
            batch_size=args.batch_size, progress=not args.json, report=args.report,
        )
    if args.json:
        print(json.dumps(result))
    else:
        from metricsearch.evaluation import format_metrics

        print(format_metrics(result))
    if args.report:
        print(f"report: {args.report}/report.html", file=sys.stderr)
    return 0


def _cmd_datasets(args: argparse.Namespace) -> int:
    from metricsearch.data import adapters

    for spec, text in adapters():
        print(f"{spec:<18} {text}")
    return 0


def _print_registry(title: str, registry, hidden: tuple[str, ...] = (), names: list[str] | None = None) -> None:
    import inspect

    from metricsearch.train.context import CONTEXT_KEYS

    print(f"{title}:")
    for name in registry.names() if names is None else names:
        params = ", ".join(
            f"{k}={v!r}" if v is not inspect.Parameter.empty else k
            for k, v in registry.parameters(name).items()
            if k not in (*CONTEXT_KEYS, *hidden)
        )
        print(f"  {name:<22} {registry.describe(name)}")
        if params:
            print(f"  {'':<22} ({params})")


def _cmd_losses(args: argparse.Namespace) -> int:
    from metricsearch.train.losses import LOSSES, learns_proxies

    beyond = [name for name in LOSSES.names() if learns_proxies(name)]
    _print_registry("losses of the five papers (loss.name=...)", LOSSES,
                    names=[name for name in LOSSES.names() if name not in beyond])
    print()
    _print_registry("losses beyond the five papers: proxies, learned per class (loss.name=...; any sampler, "
                    "random included)", LOSSES, names=beyond)
    return 0


def _cmd_samplers(args: argparse.Namespace) -> int:
    from metricsearch.train.miners import MINERS
    from metricsearch.train.samplers import SAMPLERS
    from metricsearch.train.weightings import WEIGHTINGS

    _print_registry("samplers (sampler.name=...)", SAMPLERS, ("seed", "rank", "world_size", "batches_per_epoch"))
    _print_registry("miners (miner.name=...)", MINERS)
    _print_registry("weightings (weighting.name=...)", WEIGHTINGS)
    return 0


def _cmd_optimizers(args: argparse.Namespace) -> int:
    from metricsearch.train.augment import AUGMENT_CONTEXT, AUGMENTATIONS
    from metricsearch.train.optim import OPTIMIZERS, SCHEDULES

    _print_registry("optimizers (optimizer.name=...)", OPTIMIZERS, ("params", "model", "loss"))
    _print_registry("schedules (schedule.name=...)", SCHEDULES, ("optimizer", "steps_per_epoch", "epochs"))
    _print_registry("augmentations (augment.name=...)", AUGMENTATIONS, AUGMENT_CONTEXT)
    return 0


def _cmd_inspect_loss(args: argparse.Namespace) -> int:
    from metricsearch.train import inspect_loss

    print(inspect_loss(args.loss, args.out, checkpoint=args.checkpoint, dataset=args.dataset, classes=args.classes,
                       per_class=args.per_class, dim=args.dim, seed=args.seed))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from metricsearch.app.web import parse_auth, serve

    serve(args.db, args.host, args.port, auth=parse_auth(args.auth, args.auth_file),
          max_upload_mb=args.max_upload_mb, concurrency=args.concurrency,
          max_pixels=args.max_megapixels * 1_000_000)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from metricsearch.app.demo import run_demo

    run_demo(args.dataset, args.workdir, serve=not args.no_serve, host=args.host, port=args.port)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command."""
    fmt = HelpFormatter
    parser = argparse.ArgumentParser(
        prog="metricsearch", formatter_class=fmt,
        description="Train an image embedding with deep metric learning, export it to ONNX, evaluate it, "
                    "index a gallery and serve a visual search page.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=fmt)
        p.set_defaults(func=func)
        return p

    p = add("train", _cmd_train, "Train an embedder from a YAML config; writes OUTPUT_DIR/NAME/ "
            "(config.yaml, metrics.jsonl, last.pt, best.pt, training.png). best.pt is the epoch with the best "
            "Recall@1 on validation classes held out of the training classes (--set val_classes=F, default 0.2; "
            "with fewer than 2 of them, the last epoch); the test classes are scored once, at the end, with it.")
    p.add_argument("--config", help="a YAML config file, or the name of a packaged one (digits, omniglot, demo, "
                   "grocery, cub200, cars196, sop, inshop); without it the digits recipe runs")
    p.add_argument("--set", action="extend", nargs="+", metavar="KEY=VALUE",
                   help="override config values, dotted keys, YAML values, applied in order (e.g. --set "
                        "sampler.name=p_random sampler.p=0.1 weighting.name=importance); repeatable")
    p.add_argument("--resume", action="store_true", help="continue the run from its last.pt")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run of the same name")
    p.add_argument("--device", choices=DEVICES, help="where to train (config key device)")
    p.add_argument("--name", help="run name (config key name)")
    p.add_argument("--output-dir", dest="output_dir", help="parent folder of runs (config key output_dir)")
    p.add_argument("--epochs", type=int, help="number of epochs (config key epochs)")
    p.add_argument("--pretrained", help="backbone weights: `imagenet` (downloaded once into the timm/torchvision "
                   "cache; efficientnet_lite0's come offline with the `photos` extra) or a state dict file "
                   "(config key model.pretrained)")
    p.add_argument("--stop-after-epoch", type=int, help="pause after this epoch; continue later with --resume")
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-epoch lines")

    p = add("export", _cmd_export, "Export a trained embedder, or a pretrained backbone's features with no "
            "training (--backbone), to ONNX (dynamic batch, preprocessing in the metadata) and check "
            "torch/onnxruntime parity on a batch.")
    p.add_argument("checkpoint", nargs="?", help="run directory (uses best.pt, else last.pt) or a checkpoint file")
    p.add_argument("--out", required=True, help="path of the .onnx file to write (its folder must exist)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.add_argument("--backbone", help="instead of a checkpoint: a backbone (efficientnet_lite0, resnet50, "
                   "timm:NAME, ...) whose pooled, L2-normalised features are the embedding, with its own preprocessing")
    p.add_argument("--pretrained", help="with --backbone: `imagenet` (the default) or a state dict file")
    p.add_argument("--dataset", help="data set spec for the parity batch (default: the run's data set; with "
                   "--backbone, random-pixel photos)")
    p.add_argument("--batch-size", type=int, default=32, help="images in the parity batch")
    p.add_argument("--dim", type=int, help="append a PCA projection to D dimensions, re-normalised (1280-d photo "
                   "features at 256-d: 5x less memory per item; docs/photos.md), fit on --fit-images (default: the "
                   "run's config key model.project; 0: no projection)")
    p.add_argument("--fit-images", metavar="SPEC", help="with --dim: the images to fit the projection on (default: "
                   "the run's training images; needed with --backbone)")
    p.add_argument("--whiten-projection", action="store_true", help="with --dim: divide each direction by its "
                   "standard deviation")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset version")
    p.add_argument("--atol", type=float, default=1e-4, help="largest allowed |torch - onnxruntime|")
    p.add_argument("--set", action="extend", nargs="+", metavar="KEY=VALUE",
                   help="other test-time views for the same weights: model.tta_shifts, model.tta_rotations, "
                        "model.tta_symmetries (YAML values; [] for none), e.g. --set model.tta_rotations=[]; "
                        "fewer views make a faster graph; a whitened run's whitening is fit again on its training "
                        "images")

    p = add("quantize", _cmd_quantize, "Write an int8 copy of an exported model (int8 weights and activations, "
            "ranges calibrated on images of a data set): about 2x faster on a CPU; checked against the float32 model.")
    p.add_argument("model", help="exported .onnx file (from `metricsearch export`)")
    p.add_argument("--out", required=True, help="path of the int8 .onnx file to write (its folder must exist)")
    p.add_argument("--images", required=True, help="data set spec of calibration images like those it will embed "
                   "(e.g. the training data: omniglot, folder:PATH)")
    p.add_argument("--count", type=int, default=256, help="calibration images, spread evenly over the spec")
    p.add_argument("--min-cosine", type=float, default=0.9,
                   help="fail, writing nothing, if an int8 embedding's cosine to its float32 one is lower")
    p.add_argument("--full-range", action="store_true",
                   help="8-bit weights instead of 7: only for a copy that runs on CPUs with VNNI (AVX512-VNNI, "
                   "AVX-VNNI, AMX); on CPUs without it onnxruntime's int8 sums saturate and the copy strays")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")

    p = add("evaluate", _cmd_evaluate, "Recall@K, NMI and MAP@R of an ONNX model (or raw pixels) on a data "
            "set's test classes, or of queries against a gallery, or of a built gallery through its index.")
    p.add_argument("--model", help="exported .onnx file, or `pixels` for the raw-pixel baseline")
    p.add_argument("--db", help="a gallery folder (metricsearch index build): each labelled item queries the rest "
                   "through the gallery's own index; approximate indexes also report recall@10 against exact")
    p.add_argument("--dataset", help="data set spec (see `metricsearch datasets`)")
    p.add_argument("--split-classes", type=float, help="for folder: specs without train/test sub-folders")
    p.add_argument("--query", help="folder: spec of query images (with --gallery; queries search the gallery only)")
    p.add_argument("--gallery", help="folder: spec of gallery images")
    p.add_argument("--recall-k", type=int, nargs="+", help="K values for Recall@K (default: the data set's)")
    p.add_argument("--no-nmi", action="store_true", help="skip NMI (k-means is slow on very many classes)")
    p.add_argument("--one-shot-ways", type=int, help="also report N-way one-shot accuracy over 1000 random "
                   "episodes of the test classes (Omniglot protocol: 20)")
    p.add_argument("--one-shot-protocol", choices=["within_alphabet", "across_alphabets"],
                   help="with --one-shot-ways: report the one-shot error and its 95%% confidence interval over "
                   "1000 episodes of this protocol; within_alphabet = the official Omniglot protocol (one "
                   "alphabet per episode, support and query by different drawers)")
    p.add_argument("--center", type=float, default=0.0, metavar="C",
                   help="take C (0 to 1) times the mean gallery embedding from every query and gallery embedding, "
                   "then compare by cosine: the gallery of --query/--gallery, or each one-shot episode's support "
                   "images (Omniglot: 0.5, docs/omniglot.md)")
    p.add_argument("--expand-with", metavar="SPEC", help="with --query/--gallery: unlabelled images from the "
                   "queries' domain, never the queries (e.g. shelf photos of a catalogue's products: "
                   "files:PATH); each gallery entry moves toward the ones nearest it, an anchored k-means "
                   "(photo -> catalogue accuracy 0.69 -> 0.81 on Grocery's unseen products over 5 trainings, "
                   "docs/photos.md)")
    p.add_argument("--batch-size", type=int, help="images per inference batch (default: the largest, at most 64 "
                   "on a CPU and 256 on a GPU, that keeps the job within --memory)")
    p.add_argument("--memory", default="2", metavar="GB", help="the job's peak memory budget in GB, which chooses "
                   "the batch (default: 2)")
    p.add_argument("--device", choices=DEVICES, default="auto", help="onnxruntime device")
    p.add_argument("--pixels-size", type=int, default=28, help="side of the resized image for --model pixels")
    p.add_argument("--pixels-channels", type=int, default=1, choices=[1, 3], help="channels for --model pixels")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: recall_at_k, nmi, map_at_r, n_queries")
    p.add_argument("--report", metavar="DIR", help="also write where the model fails into DIR: worst.png, classes.csv, "
                   "classes.png, confusions.csv, map.png (t-SNE) and report.html (needs the `report` extra)")

    add_index_commands(sub, add)
    add("datasets", _cmd_datasets, "List the data set adapters and their spec strings.")
    add("losses", _cmd_losses, "List every loss with its parameters and defaults.")
    add("samplers", _cmd_samplers, "List the batch samplers, miners and pair weightings with their parameters.")
    add("optimizers", _cmd_optimizers,
        "List the optimizers, learning-rate schedules and augmentations with their parameters.")

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

    p = add("serve", _cmd_serve, "Serve the visual search page (and its /search API) for a gallery; prints the URL.")
    p.add_argument("--db", required=True, help="gallery folder (made by `metricsearch index`)")
    _add_address(p)
    who = p.add_mutually_exclusive_group()
    who.add_argument("--auth", metavar="USER:PASS", help="require this login (others on the machine can see "
                     "it in `ps`: prefer --auth-file); without --auth or --auth-file the page needs no login")
    who.add_argument("--auth-file", metavar="FILE", help="require a login from FILE (a regular text file): one "
                     "USER:PASS per line")
    p.add_argument("--max-upload-mb", type=float, default=10, help="largest upload accepted, in MB (at most 1024)")
    p.add_argument("--max-megapixels", type=float, default=25, help="largest query image accepted, in megapixels "
                   "(at most 100)")
    p.add_argument("--concurrency", type=int, default=4, help="searches run at once (at most 64); requests that "
                   "arrive together share one inference call")

    p = add("demo", _cmd_demo, "The whole chain, offline: train, export to ONNX, index the test classes, "
            "print the evaluation and a sample search, then serve the page. A second run reuses what is there.")
    p.add_argument("--dataset", default="omniglot", help="data set spec: omniglot (embedded, the default), digits, "
                   "omniglot:PATH, ...")
    p.add_argument("--workdir", default="metricsearch-demo", help="folder for the run, model and gallery")
    p.add_argument("--no-serve", action="store_true", help="stop after the printout (for CI and scripts)")
    _add_address(p)
    return parser


def _add_address(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 exposes the page to the network)")
    p.add_argument("--port", type=int, default=7860, help="port to listen on")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `metricsearch` console script; user errors exit 2 with one line, never a traceback."""
    args = build_parser().parse_args(argv)
    prefix = " ".join(["metricsearch", args.command] + ([args.index_command] if args.command == "index" else []))
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a reader that stopped reading (`| head`) is not an error
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more reaches the closed pipe
        return 141  # as a shell reports a command ended by SIGPIPE
    except ModuleNotFoundError as exc:
        if exc.name not in ("torch", "torchvision", "onnx", "matplotlib", "sklearn"):
            raise
        hint = REPORT_EXTRA_HINT if getattr(args, "report", None) else TRAIN_EXTRA_HINT
        print(f"{prefix}: error: {prefix} {hint}", file=sys.stderr)
        return 2
    except SplitClassesError as exc:  # in the words of this command's own options
        print(f"{prefix}: error: {exc.worded(*SPLIT_CLASSES_OPTIONS.get(args.command, (None, None)))}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:
        print(f"{prefix}: error: {exc}", file=sys.stderr)
        return 2
    except MetricsearchError as exc:
        print(f"{prefix}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        hint = {"train": "; the last finished epoch is in last.pt: run the same command with --resume",
                "index": "; committed batches are kept: run `index build` again with --resume, or `index add` "
                         "again (images it holds are skipped)"}.get(args.command, "")
        print(f"{prefix}: interrupted{hint}", file=sys.stderr)
        return 130
