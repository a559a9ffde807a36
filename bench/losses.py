"""Forward+backward time of every registered loss against pytorch-metric-learning's equivalent.

Prints one markdown table per device: median milliseconds over `--repeats` timed runs (after one
warm-up run) for our loss and, where one exists, pytorch-metric-learning's (PML) equivalent,
measured in the same run, and their ratio. Batches are B/8 classes x 8 images of random
`--dim`-d embeddings. PML runs projected from the previous batch size (with the loss's cost
exponent in B: 3 for PML's LiftedStructureLoss, 2 otherwise) to take longer than
`--pml-timeout-s` per forward+backward are skipped.

    python bench/losses.py --batch-sizes 128 512 1024 --dim 512 --repeats 3 --device auto
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
from torch import Tensor, nn

from metricsearch.train.context import TrainContext
from metricsearch.train.losses import build, names

LossFn = Callable[[Tensor, Tensor], Tensor]
IMAGES_PER_CLASS = 8
# PML's LiftedStructureLoss builds a (positive pairs x negative pairs) matrix: cubic in B
CUBIC = {"lifted"}


def pml_equivalents() -> dict[str, Callable[[], LossFn]]:
    """Our loss name -> builder of PML's equivalent with matching defaults (empty without PML)."""
    try:
        from pytorch_metric_learning import distances, losses, miners
    except ImportError:
        return {}

    def ms() -> LossFn:
        loss, miner = losses.MultiSimilarityLoss(alpha=2, beta=50, base=0.5), miners.MultiSimilarityMiner(0.1)
        return lambda emb, labels: loss(emb, labels, miner(emb, labels))

    return {
        "contrastive": lambda: losses.ContrastiveLoss(pos_margin=0.0, neg_margin=1.0),
        "triplet": lambda: losses.TripletMarginLoss(margin=0.2, distance=distances.LpDistance(power=2)),
        "triplet_l2": lambda: losses.TripletMarginLoss(margin=0.2),
        "margin": lambda: losses.MarginLoss(margin=0.2, beta=1.2),
        "ms": ms,
        "generalized_lifted": lambda: losses.GeneralizedLiftedStructureLoss(
            neg_margin=0.0, pos_margin=1.0, distance=distances.CosineSimilarity()
        ),
        "lifted": lambda: losses.LiftedStructureLoss(neg_margin=1.0, pos_margin=0.0),
        "npair": lambda: losses.NPairsLoss(),
    }


def batch(size: int, dim: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Random embeddings (a grad-requiring leaf) and labels of size/8 classes x 8 images."""
    labels = torch.arange(size // IMAGES_PER_CLASS, device=device).repeat_interleave(IMAGES_PER_CLASS)
    return torch.randn(labels.numel(), dim, device=device, requires_grad=True), labels


def time_ms(fn: LossFn, emb: Tensor, labels: Tensor, repeats: int) -> float:
    """Median forward+backward milliseconds over `repeats` runs, after one warm-up run."""
    sync = torch.cuda.synchronize if emb.is_cuda else (lambda: None)
    times = []
    for _ in range(repeats + 1):
        emb.grad = None
        sync()
        start = time.perf_counter()
        fn(emb, labels).backward()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[1:])


def attempt_ms(make: Callable[[], LossFn], emb: Tensor, labels: Tensor, repeats: int) -> float | str:
    """`time_ms` of the loss `make` builds, or `error: NAME` where it cannot run on this batch (out of memory, say)."""
    try:
        return time_ms(make(), emb, labels, repeats)
    except Exception as error:  # reported in the table, not fatal
        if emb.is_cuda:
            torch.cuda.empty_cache()
        return f"error: {type(error).__name__}"


def cell(ms: float | str) -> str:
    """A table cell for `attempt_ms`'s answer: milliseconds to 2 decimals, or its error as it is."""
    return ms if isinstance(ms, str) else f"{ms:.2f}"


def ours(name: str, labels: Tensor, device: torch.device, dim: int) -> LossFn:
    """Our loss `name` with its defaults; class statistics, where it takes them, from the batch (proxies: one class
    each, of `dim` dimensions)."""
    classes, counts = torch.unique(labels, return_counts=True)
    class_counts = dict(zip(classes.tolist(), counts.tolist()))
    context = TrainContext(labels.cpu().numpy(), class_counts, len(class_counts), len(labels), embedding_dim=dim)
    module: nn.Module = build(name, context)
    return module.to(device)


def bench_device(args: argparse.Namespace, device: torch.device) -> None:
    """Print the table of one device."""
    equivalents = pml_equivalents()
    last_pml: dict[str, tuple[int, float]] = {}  # name -> (batch size, seconds per run)
    where = (
        torch.cuda.get_device_name(device) if device.type == "cuda"
        else f"{torch.get_num_threads()} threads"
    )
    print(f"\n### {device.type}: {where}, dim {args.dim}, "
          f"median of {args.repeats} after 1 warm-up (ms, forward+backward)\n")
    print("| loss | B | ours | PML | ours/PML |")
    print("|---|---:|---:|---:|---:|")
    for size in args.batch_sizes:
        for name in names():
            torch.manual_seed(0)
            emb, labels = batch(size, args.dim, device)
            mine = attempt_ms(lambda: ours(name, labels, device, args.dim), emb, labels, args.repeats)
            ours_ms = cell(mine)
            pml_ms, ratio = "-", "-"
            if name in equivalents:
                prev = last_pml.get(name)
                exponent = 3 if name in CUBIC else 2
                projected = prev[1] * (size / prev[0]) ** exponent if prev else 0.0
                if projected > args.pml_timeout_s:
                    pml_ms = f"skipped (>{args.pml_timeout_s:g}s)"
                else:
                    value = attempt_ms(equivalents[name], emb, labels, args.repeats)
                    pml_ms = cell(value)
                    if not isinstance(value, str):
                        last_pml[name] = (size, value / 1e3)
                        if not isinstance(mine, str):
                            ratio = f"{mine / value:.2f}"
            print(f"| {name} | {size} | {ours_ms} | {pml_ms} | {ratio} |", flush=True)


def devices(choice: str) -> list[torch.device]:
    """The devices to benchmark: `auto` is the CPU plus CUDA when available."""
    if choice == "auto":
        return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available")
    return [torch.device(choice)]


def main() -> None:
    """Parse arguments and print one table per device."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[128, 512, 1024])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (after 1 warm-up)")
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto",
                        help="auto: the CPU, plus CUDA when available")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)")
    parser.add_argument("--pml-timeout-s", type=float, default=5.0,
                        help="skip PML runs projected to take longer than this per forward+backward")
    args = parser.parse_args()
    if any(size < 2 * IMAGES_PER_CLASS for size in args.batch_sizes):
        parser.error(f"batch sizes must be >= {2 * IMAGES_PER_CLASS} ({IMAGES_PER_CLASS} images per class)")
    args.batch_sizes = sorted(args.batch_sizes)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    for device in devices(args.device):
        bench_device(args, device)


if __name__ == "__main__":
    main()
