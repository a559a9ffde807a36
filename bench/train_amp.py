"""bfloat16 against float32 training steps, on CPUs with and without bfloat16 in hardware.

One child process per oneDNN ISA limit (`ONEDNN_MAX_CPU_ISA`, set before torch loads): `native` = all this
CPU has; `AVX512_CORE` = AVX-512 without bf16 instructions (Intel Xeon from Skylake to Ice Lake);
`AVX2` = most laptops and AMD before Zen 4. Each child builds the trainer's setup for a config twice, in
float32 and with bf16 autocast forced (what `amp: bf16` ran before it fell back to float32 on CPUs without
bf16 in hardware), and times `train_step` on the same pre-drawn batches, the two alternating batch by batch
(`bench/train_channels_last.py`'s timing). The table gives images per second (median of the timed steps), the
ratio bf16 / float32 (the reference, measured in the same process) and what `amp: bf16` trains in there
now (`metricsearch.train.device.cpu_has_native_bf16`).

Run from the repository root: `python bench/train_amp.py` (configs/omniglot.yaml, its CNN, channels-last as
the config says).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from metricsearch.train.config import load_config, typed_config
from metricsearch.train.device import cpu_has_native_bf16
from metricsearch.train.trainer import build_setup
from results_files import write_results
from train_channels_last import CASES, batches, time_steps

ISAS = ["native", "AVX512_CORE", "AVX2"]


def measure(case: str, steps: int, warmup: int) -> dict:
    """Images per second of float32 and forced-bf16 steps in this process (its oneDNN ISA limit)."""
    config, overrides = CASES[case]
    arms = {name: build_setup(typed_config(load_config(config, [*overrides, "amp=off"])))
            for name in ("float32", "bf16")}
    arms["bf16"].autocast = torch.bfloat16  # forced: amp: bf16 itself would fall back to float32 where bf16 is slow
    speed = time_steps(arms, batches(arms["float32"], steps + warmup), warmup)
    return {"case": case, "native_bf16": cpu_has_native_bf16(), **speed, "ratio": speed["bf16"] / speed["float32"]}


def line(isa: str, row: dict) -> str:
    """One table row."""
    trains = "bf16" if row["native_bf16"] else "float32 (falls back)"
    return (f"| {row['case']} | {isa} | {'yes' if row['native_bf16'] else 'no'} | {row['float32']:,.0f} | "
            f"{row['bf16']:,.0f} | {row['ratio']:.2f}x | {trains} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per precision")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--isa", nargs="+", default=ISAS, choices=ISAS, help="oneDNN ISA limits to run under")
    parser.add_argument("--cases", nargs="+", default=["omniglot small_cnn 28 px"], choices=list(CASES), metavar="CASE")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one measurement, printed as JSON
    parser.add_argument("--results", type=Path, help="write the table (.md) and the numbers (.json) here")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps([measure(case, args.steps, args.warmup) for case in args.cases]))
        return 0
    header = ("| case | oneDNN ISA limit | bf16 in hardware | float32 img/s | bf16 img/s | bf16 / float32 | "
              "`amp: bf16` trains in |\n|---|---|---|---:|---:|---:|---|")
    print(header, flush=True)
    rows, lines = [], []
    for isa in args.isa:
        env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
        if isa != "native":
            env["ONEDNN_MAX_CPU_ISA"] = isa
        child = [sys.executable, __file__, "--child", "--steps", str(args.steps), "--warmup", str(args.warmup),
                 "--cases", *args.cases]
        out = subprocess.run(child, env=env, capture_output=True, text=True, check=True).stdout
        for row in json.loads(out.strip().splitlines()[-1]):
            rows.append({"isa": isa, **row})
            lines.append(line(isa, row))
            print(lines[-1], flush=True)
    if args.results:
        title = "# Training steps: bfloat16 against float32 by CPU instruction set"
        write_results(args.results, f"{title}\n\n`python bench/train_amp.py`, {torch.get_num_threads()} threads, "
                      f"torch {torch.__version__}.\n\n{header}\n" + "\n".join(lines), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
