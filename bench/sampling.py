"""Time per batch of every miner next to PML's equivalent, and as a share of one training step.

Run: `python bench/sampling.py [--dim 128] [--per-class 8] [--repeats 5]`. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from metricsearch.train import losses
from metricsearch.train.miners import MINERS, build_miner

SIZES = (128, 512, 1024)


def our_miners() -> dict[str, Callable]:
    """Every registered miner, with the parameters used for the comparison."""
    params = {"semihard": {"margin": 0.2}, "random": {"fraction": 0.5, "produces": "triplets"}}
    return {name: build_miner(name, **params.get(name, {})) for name in MINERS.names()}


def pml_miners() -> dict[str, tuple[str, Callable]]:
    """PML's closest equivalent of each miner (name, callable); empty when PML is not installed."""
    try:
        from pytorch_metric_learning import miners
    except ImportError:
        return {}
    hard = miners.BatchEasyHardMiner(pos_strategy="all", neg_strategy="hard")
    return {
        "semihard": ("TripletMarginMiner(semihard)",
                     miners.TripletMarginMiner(margin=0.2, type_of_triplets="semihard")),
        "hard": ("BatchEasyHardMiner(all, hard)", hard),
        "batch_hard": ("BatchHardMiner", miners.BatchHardMiner()),
        "distance_weighted": ("DistanceWeightedMiner", miners.DistanceWeightedMiner()),
        "ms": ("MultiSimilarityMiner", miners.MultiSimilarityMiner(epsilon=0.1)),
    }


def median_seconds(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median wall time of each of `fns` over `repeats` interleaved rounds after one warm-up.

    Interleaving makes the compared functions share whatever load the machine has at the time.
    """
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(repeats):
        for fn, spent in zip(fns, times):
            start = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - start)
    return [statistics.median(spent) for spent in times]


def small_cnn() -> tuple[nn.Module, str]:
    """The project's small embedder if `metricsearch.models` is there, else a local 4-conv CNN."""
    try:
        from metricsearch.models.torch_embedder import build_embedder

        return build_embedder({"backbone": "small_cnn", "dim": 128, "preprocessing": {"size": 32}}), \
            "metricsearch.models small_cnn embedder"
    except ImportError:
        layers: list[nn.Module] = []
        for c_in, c_out in ((1, 32), (32, 64), (64, 64), (64, 128)):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(), nn.MaxPool2d(2)]
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(128 * 2 * 2, 128)), \
            "local 4-conv CNN (metricsearch.models not importable)"


def step_seconds(batch: int, per_class: int, repeats: int) -> tuple[float, str]:
    """Median time of one forward + backward + Adam step of a small CNN on 1x32x32 inputs."""
    model, what = small_cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    loss_fn = losses.build("contrastive")
    images = torch.randn(batch, 1, 32, 32)
    labels = torch.arange(batch) // per_class

    def step() -> None:
        opt.zero_grad()
        loss_fn(model(images), labels).backward()
        opt.step()

    return median_seconds([step], repeats)[0], what


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--per-class", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: stable on a shared CPU)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ours, theirs = our_miners(), pml_miners()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, dim {args.dim}, "
          f"{args.per_class} images per class, median of {args.repeats}\n")
    print("| miner | B | ours (ms) | PML equivalent | PML (ms) | PML / ours |")
    print("|---|---|---|---|---|---|")
    at_128: dict[str, float] = {}
    for size in SIZES:
        gen = torch.Generator().manual_seed(size)
        emb = F.normalize(torch.randn(size, args.dim, generator=gen), dim=1)
        labels = torch.arange(size) // args.per_class
        for name, miner in ours.items():
            run_ours = partial(miner, emb, labels)
            if name in theirs:
                pml_name, pml = theirs[name]
                t_ours, t_pml = median_seconds([run_ours, partial(pml, emb, labels)], args.repeats)
                print(f"| {name} | {size} | {t_ours * 1e3:.2f} | {pml_name} | {t_pml * 1e3:.2f} | "
                      f"{t_pml / t_ours:.2f} |")
            else:
                (t_ours,) = median_seconds([run_ours], args.repeats)
                print(f"| {name} | {size} | {t_ours * 1e3:.2f} | none | - | - |")
            if size == SIZES[0]:
                at_128[name] = t_ours
    step, what = step_seconds(SIZES[0], args.per_class, args.repeats)
    print(f"\nOne training step at B={SIZES[0]} ({what}, contrastive loss, Adam, CPU): {step * 1e3:.1f} ms\n")
    print(f"| miner | time at B={SIZES[0]} (ms) | % of a training step |")
    print("|---|---|---|")
    for name, seconds in at_128.items():
        print(f"| {name} | {seconds * 1e3:.2f} | {100 * seconds / step:.2f}% |")


if __name__ == "__main__":
    main()
