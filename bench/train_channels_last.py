"""Training speed in channels-last against contiguous tensors, through the trainer's own setup and step.

For each config (and each precision asked for), the trainer builds its setup twice, once per memory layout
of the weights and batches, and the same pre-drawn batches (augmented, as in training) go through
`train_step` in turn, alternating layouts batch by batch so that a change of load touches both alike.
The first steps of each warm up and are not counted. The table gives images per second (median over the
timed steps) and the ratio to contiguous, the reference measured in the same run, and how far each layout's
float32 gradients are from float64 ones: the largest error of a parameter's gradient relative to its
largest entry (or to a millionth of the largest entry of all, where that is more), on 8 images, batch norm
in training mode, dropout off, a squared error to random targets. The trainer lays out as the config's
`channels_last` says (`metricsearch.train.device.memory_format`): auto = on CUDA only.

Run from the repository root: `python bench/train_channels_last.py` (configs/omniglot.yaml, its CNN on the shipped
background sets; configs/grocery.yaml, EfficientNet-Lite0 at 224 px on ../shared/data/grocery, fine-tuned whole
and on its cached frozen trunk; each in float32 and bfloat16).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np
import torch

from metricsearch.train.config import load_config, typed_config
from metricsearch.train.trainer import Setup, build_setup, epoch_batches, train_step
from results_files import write_results

#: label -> (config, overrides): the shipped recipes on their data (the grocery photos from ../shared/data)
CASES = {
    "omniglot small_cnn 28 px": ("omniglot", []),
    "omniglot small_resnet 28 px": ("omniglot", ["model.backbone=small_resnet"]),
    "grocery efficientnet_lite0 224 px, whole": ("grocery", ["model.freeze=0", "trunk_cache=0", "num_workers=0"]),
    "grocery efficientnet_lite0 224 px, trunk cache": ("grocery", ["num_workers=0", "trunk_cache=1"]),
}
LAYOUTS = {"contiguous": False, "channels-last": True}  # the config's channels_last


def setups(config: str, overrides: list[str]) -> dict[str, Setup]:
    """The trainer's setup for `config` once per layout (its channels_last key set)."""
    return {name: build_setup(typed_config(load_config(config, [*overrides, f"channels_last={value}"])))
            for name, value in LAYOUTS.items()}


def batches(setup: Setup, count: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The first `count` training batches of epoch 0, as the trainer draws them."""
    setup.sampler.set_epoch(0)
    return list(itertools.islice(epoch_batches(setup, seed=0), count))


def gradient_error(setup: Setup, images: torch.Tensor, layout: torch.memory_format, count: int = 8) -> float:
    """The largest error of a float32 parameter gradient in `layout` against float64, relative to its largest entry."""
    from metricsearch.models.torch_embedder import build_embedder

    torch.manual_seed(0)
    target = torch.randn(count, setup.model.dim, dtype=torch.float64)

    def gradients(dtype: torch.dtype, layout: torch.memory_format) -> list[torch.Tensor]:
        model = build_embedder(setup.model.config)  # not a deepcopy: the frozen trunk's closures would stay behind
        model.load_state_dict(setup.model.state_dict())
        model = model.to(dtype).to(memory_format=layout).eval()
        for module in model.modules():  # batch norm as in training, dropout and drop-path off
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.train()
        x = images[:count].to(dtype).contiguous(memory_format=layout)
        y = model(x) if setup.trunk_cache is None else model.embed_from_trunk(x)
        ((y - target.to(dtype)) ** 2).sum().backward()
        return [p.grad.double() for p in model.parameters() if p.grad is not None]

    exact = gradients(torch.float64, torch.contiguous_format)
    floor = 1e-6 * max(float(b.abs().max()) for b in exact)  # a parameter with no gradient to speak of: vs the rest
    return max(float((a - b).abs().max()) / max(float(b.abs().max()), floor)
               for a, b in zip(gradients(torch.float32, layout), exact, strict=True))


def time_steps(arms: dict[str, Setup], data: list, warmup: int) -> dict[str, float]:
    """Images per second of each arm: the median over the batches after `warmup`, arms alternating."""
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    for setup in arms.values():
        setup.model.train()
    for images, labels, indices in data:
        for name, setup in arms.items():
            t0 = time.perf_counter()
            train_step(setup, images, labels, indices).item()
            seconds[name].append(time.perf_counter() - t0)
    size = len(data[0][0])
    return {name: size / float(np.median(s[warmup:])) for name, s in seconds.items()}


def line(row: dict) -> str:
    """One table row."""
    errors = row["gradient_error"]
    return (f"| {row['case']} | {row['amp']} | {row['batch']} | {row['contiguous']:,.0f} | {row['channels-last']:,.0f} "
            f"| {row['ratio']:.2f}x | {errors['contiguous']:.1e} | {errors['channels-last']:.1e} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per layout and case")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--amp", nargs="+", default=["off", "bf16"], help="precisions (the config's amp key)")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES), metavar="CASE")
    parser.add_argument("--results", type=Path, help="write the table (.md) and the numbers (.json) here")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rows = []
    header = ("| case | amp | batch | contiguous img/s | channels-last img/s | ratio | gradient error "
              "contiguous | channels-last |\n|---|---|---:|---:|---:|---:|---:|---:|")
    print(header)
    for case in args.cases:
        config, overrides = CASES[case]
        for amp in args.amp:
            arms = setups(config, [*overrides, f"amp={amp}"])
            data = batches(next(iter(arms.values())), args.steps + args.warmup)
            speed = time_steps(arms, data, args.warmup)
            errors = {name: gradient_error(setup, data[0][0], setup.layout) for name, setup in arms.items()}
            row = {"case": case, "amp": amp, "batch": len(data[0][0]), **speed,
                   "ratio": speed["channels-last"] / speed["contiguous"], "gradient_error": errors}
            rows.append(row)
            print(line(row), flush=True)
    if args.results:
        lines = "".join(line(r) + "\n" for r in rows)
        cpu = torch.backends.cpu.get_cpu_capability()
        write_results(args.results,
                      f"# Training steps: channels-last against contiguous\n\n`python bench/train_channels_last.py`, "
                      f"{torch.get_num_threads()} threads, CPU capability {cpu}, torch {torch.__version__}.\n\n"
                      + header + "\n" + lines, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
