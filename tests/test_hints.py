"""Every hint an error gives names an option the command that printed it accepts, and following it works: each case
triggers the error through the real command line, takes the options the one-line message suggests, and runs the
command again with each of them."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from metricsearch.app.cli import build_parser

TIMEOUT = 600
#: a training as short as it gets: one step an epoch, one epoch
SHORT = ["--set", "epochs=1", "batches_per_epoch=1", "eval.nmi=false"]
#: the placeholders of a suggested value, and what the rerun passes for them
VALUES = {"F": "0.5", "OTHER": "other"}


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "metricsearch", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=TIMEOUT)


def options_of(args: list[str]) -> dict[str, argparse.Action]:
    """The options the (sub)command that `args` start with accepts, by option string."""
    parser = build_parser()
    words = list(args)
    while True:
        commands = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if commands is None or not words or words[0] not in commands.choices:
            break
        parser = commands.choices[words.pop(0)]
    return {option: action for action in parser._actions for option in action.option_strings}


def suggestions(message: str, accepted: dict[str, argparse.Action]) -> list[tuple[str, list[str]]]:
    """Each option the message suggests (not one it is labelled by, `--resume: ...`): ("drop", [option]) after
    "leave out" or "without", else ("add", [option, value]) with the value that follows where the option takes one."""
    found = []
    for match in re.finditer(r"(leave out |without )?(--[a-z][a-z-]*)(?![a-z:-])(?: ([^\s,;()`]+))?", message):
        verb, option, value = match.groups()
        assert option in accepted, f"the hint names {option}, which the command does not accept: {message}"
        if verb:
            found.append(("drop", [option]))
        elif accepted[option].nargs == 0:
            found.append(("add", [option]))
        else:
            key, sep, placeholder = (value or "").rpartition("=")
            found.append(("add", [option, f"{key}{sep}{VALUES.get(placeholder, placeholder)}" if value else ""]))
    return found


def followed(args: list[str], verb: str, option: list[str], accepted: dict[str, argparse.Action]) -> list[str]:
    """`args` with a suggested option added (after the others: a later --set wins) or dropped with its value."""
    if verb == "add":
        return [*args, *option]
    at = args.index(option[0])
    return args[:at] + args[at + 1 + (accepted[option[0]].nargs != 0):]


def check_hints(args: list[str], cwd: Path, expect: str, fill: dict[str, str] | None = None) -> None:
    """`args` fail with one line holding `expect`; every option it suggests is the command's, and the command with
    each suggestion followed (an option's missing value from `fill`) is accepted and succeeds."""
    failed = cli(args, cwd)
    lines = failed.stderr.strip().splitlines()
    assert failed.returncode == 2 and len(lines) == 1 and expect in lines[0], failed.stderr[-3000:]
    accepted = options_of(args)
    hints = suggestions(lines[0].split(": error: ", 1)[1], accepted)
    assert hints, lines[0]
    for verb, option in hints:
        if verb == "add" and option[1:] == [""]:
            option = [option[0], (fill or {})[option[0]]]
        done = cli(followed(args, verb, option, accepted), cwd)
        assert "unrecognized arguments" not in done.stderr and "usage:" not in done.stderr, done.stderr[-3000:]
        assert done.returncode == 0, f"{verb} {option}: {done.stderr[-3000:]}"


def class_folders(root: Path, classes: int = 4, per_class: int = 6) -> Path:
    """One sub-folder of small gray PNGs per class."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (16, 16), dtype=np.uint8)).save(root / f"c{c}" / f"{i}.png")
    return root


def test_a_folder_without_train_and_test_names_the_commands_own_split_option(tmp_path: Path) -> None:
    plain = class_folders(tmp_path / "plain")
    base = ["train", *SHORT, f"dataset=folder:{plain}", "sampler.classes_per_batch=2", "val_classes=0",
            f"output_dir={tmp_path / 'runs'}"]
    check_hints(base, tmp_path, "pass --set split_classes=F")
    check_hints(["evaluate", "--model", "pixels", "--pixels-size", "8", "--dataset", f"folder:{plain}"], tmp_path,
                "pass --split-classes F")
    demo = cli(["demo", "--dataset", f"folder:{plain}", "--workdir", str(tmp_path / "demo"), "--no-serve"], tmp_path)
    assert demo.returncode == 2 and "make train/ and test/ sub-folders" in demo.stderr, demo.stderr[-3000:]
    assert "--" not in demo.stderr.split(": error: ", 1)[1]  # demo has no option for a class split


def test_a_split_fraction_where_the_split_is_fixed_names_how_to_drop_it(tmp_path: Path) -> None:
    parted = tmp_path / "parted"
    class_folders(parted / "train", classes=2)
    class_folders(parted / "test", classes=2)
    check_hints(["train", *SHORT, "split_classes=0.5", f"output_dir={tmp_path / 'runs'}"], tmp_path,
                "pass --set split_classes=null")
    check_hints(["evaluate", "--model", "pixels", "--pixels-size", "8", "--dataset", f"folder:{parted}",
                 "--split-classes", "0.5"], tmp_path, "leave out --split-classes")


def test_an_existing_run_and_a_missing_one_name_resume_overwrite_and_another_name(tmp_path: Path) -> None:
    base = ["train", *SHORT, f"output_dir={tmp_path / 'runs'}", "--quiet"]
    assert cli(base, tmp_path).returncode == 0
    check_hints(base, tmp_path, "pass --resume to continue it")
    check_hints(["train", *SHORT, f"output_dir={tmp_path / 'runs'}", "name=never", "--resume"], tmp_path,
                "start the run without --resume")
    out = tmp_path / "digits.onnx"
    export = ["export", str(tmp_path / "runs" / "digits"), "--out", str(out)]
    assert cli(export, tmp_path).returncode == 0
    check_hints(export, tmp_path, "replace it with --overwrite", fill={"--out": str(tmp_path / "other.onnx")})


@pytest.mark.skipif(torch.cuda.is_available(), reason="the hint is for a machine without CUDA")
def test_cuda_without_a_gpu_names_the_device_option(tmp_path: Path) -> None:
    check_hints(["train", *SHORT, f"output_dir={tmp_path / 'runs'}", "--device", "cuda"], tmp_path,
                "use --device cpu")


def test_a_missing_public_data_set_says_how_to_download_it_in_words_every_command_can_follow(tmp_path: Path) -> None:
    missing = f"cub200:{tmp_path / 'missing'}"
    for args in (["train", *SHORT, f"dataset={missing}", f"output_dir={tmp_path / 'runs'}"],
                 ["evaluate", "--model", "pixels", "--dataset", missing],
                 ["index", "build", "--db", str(tmp_path / "db"), "--model", str(tmp_path / "m.onnx"),
                  "--images", missing]):
        failed = cli(args, tmp_path)
        lines = failed.stderr.strip().splitlines()
        assert failed.returncode == 2 and len(lines) == 1 and "download: true" in lines[0], failed.stderr[-3000:]
        assert suggestions(lines[0].split(": error: ", 1)[1], options_of(args)) == [], lines[0]
