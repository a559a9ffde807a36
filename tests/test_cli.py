"""The command line: help texts, listings, query/gallery evaluation and clear errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from metricsearch.app.cli import build_parser, main

COMMANDS = ["train", "export", "evaluate", "datasets", "losses", "samplers", "optimizers", "inspect-loss", "index",
            "search", "serve", "demo"]


def make_folder(root: Path, classes: dict[str, int], seed: int = 0) -> Path:
    """One sub-folder per class of small PNGs whose brightness pattern depends on the class."""
    rng = np.random.default_rng(seed)
    for c, (name, n) in enumerate(sorted(classes.items())):
        (root / name).mkdir(parents=True)
        for i in range(n):
            base = np.zeros((16, 16), np.uint8)
            base[:, c * 3:(c * 3) + 4] = 255
            noise = rng.integers(0, 40, size=(16, 16), dtype=np.uint8)
            Image.fromarray(np.clip(base.astype(int) + noise, 0, 255).astype(np.uint8)).save(root / name / f"{i}.png")
    return root


def test_console_script_help_lists_every_command() -> None:
    out = subprocess.run([sys.executable, "-m", "metricsearch", "--help"], capture_output=True, text=True, check=True)
    for cmd in COMMANDS:
        assert cmd in out.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_is_explained(command: str) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    for action in sub._actions:
        if action.dest != "help":
            assert action.help, f"{command} {action.option_strings or action.dest} has no help text"


def test_listings(capsys) -> None:
    assert main(["datasets"]) == 0
    assert "omniglot:PATH" in capsys.readouterr().out
    assert main(["losses"]) == 0
    out = capsys.readouterr().out
    assert "ms " in out and "alpha=2.0" in out
    assert main(["samplers"]) == 0
    assert "p_random" in capsys.readouterr().out


def test_pixels_baseline_on_query_and_gallery_folders(tmp_path, capsys) -> None:
    query = make_folder(tmp_path / "q", {"a": 3, "b": 3, "c": 3}, seed=1)
    gallery = make_folder(tmp_path / "g", {"a": 4, "b": 4, "c": 4, "d": 4}, seed=2)
    code = main(["evaluate", "--model", "pixels", "--query", f"folder:{query}", "--gallery", f"folder:{gallery}",
                 "--recall-k", "1", "4", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n_queries"] == 9
    assert result["recall_at_k"] == {"1": 1.0, "4": 1.0}  # each class has its own bright stripe
    assert main(["evaluate", "--model", "pixels", "--query", f"folder:{query}", "--gallery", f"folder:{gallery}",
                 "--recall-k", "1", "--center", "1"]) == 0  # the stripes stay apart once the gallery mean is off
    out = capsys.readouterr().out
    assert "Recall@1     1.0000" in out and "centred      by 1 x the mean gallery embedding" in out
    pool = make_folder(tmp_path / "p", {"a": 2, "b": 2, "c": 2}, seed=3)
    assert main(["evaluate", "--model", "pixels", "--query", f"folder:{query}", "--gallery", f"folder:{gallery}",
                 "--recall-k", "1", "--expand-with", f"files:{pool}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recall_at_k"] == {"1": 1.0}  # the entries kept their own stripes


@pytest.mark.parametrize("argv, message", [
    (["evaluate", "--model", "pixels", "--dataset", "omniglott:/x"], "unknown"),
    (["evaluate", "--model", "pixels", "--dataset", "folder:/does/not/exist"], "does/not/exist"),
    (["evaluate", "--model", "/no/such/model.onnx", "--dataset", "digits"], "does not exist"),
    (["train", "--set", "loss.name=msx"], "Did you mean ms"),
    (["train", "--set", "sampler.classes_per_batch"], "key=value"),
    (["train", "--config", "/no/such.yaml"], "not found"),
    (["export", "/no/such/run", "--out", "x.onnx"], "does not exist"),
    (["evaluate", "--db", "/no/such/db", "--center", "0.5"], "--center and --expand-with go with --model"),
    (["evaluate", "--model", "pixels", "--dataset", "digits", "--expand-with", "digits"], "pass query and gallery"),
])
def test_bad_input_gives_a_clear_error(argv, message, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_non_image_files_are_skipped_with_a_count(tmp_path, capsys) -> None:
    root = make_folder(tmp_path / "d", {"a": 3, "b": 3, "c": 3, "e": 3})
    (root / "a" / "broken.png").write_text("not an image")
    (root / "b" / "notes.txt").write_text("ignored")
    with pytest.warns(UserWarning, match="1 unreadable"):
        code = main(["evaluate", "--model", "pixels", "--dataset", f"folder:{root}", "--split-classes", "0.5",
                     "--no-nmi", "--recall-k", "1", "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["n_queries"] == 6


def test_inspect_loss_writes_a_png(tmp_path) -> None:
    out = tmp_path / "weights.png"
    assert main(["inspect-loss", "--loss", "ms", "--loss", "ice", "--loss", "dro_kl", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


def test_train_combines_components_from_the_command_line(tmp_path, capsys) -> None:
    code = main(["train", "--quiet", "--set", "sampler.name=p_random", "sampler.p=0.1", "weighting.name=importance",
                 "loss.name=contrastive", "epochs=1", "batches_per_epoch=2", "eval.nmi=false",
                 f"output_dir={tmp_path}"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    saved = (Path(summary["run_dir"]) / "config.yaml").read_text()
    config = yaml.safe_load(saved)
    assert config["sampler"]["name"] == "p_random" and config["sampler"]["p"] == 0.1
    assert config["weighting"]["name"] == "importance" and config["loss"]["name"] == "contrastive"
    *rows, test = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    assert summary["last"] == json.loads(rows[-1]) and summary["test"] == json.loads(test)  # what it printed it ran


def test_incompatible_components_are_refused_at_start_up(tmp_path, capsys) -> None:
    code = main(["train", "--quiet", "--set", "miner.name=semihard", "loss.name=contrastive", f"output_dir={tmp_path}"])
    assert code == 2
    assert "triplet" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_inspect_loss_on_a_trained_model(digits_run, tmp_path) -> None:
    out = tmp_path / "trained.png"
    assert main(["inspect-loss", "--loss", "ms", "--loss", "contrastive", "--checkpoint", str(digits_run.run_dir),
                 "--classes", "5", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(600)
def test_training_interrupted_with_ctrl_c_resumes(tmp_path) -> None:
    import signal

    import torch

    args = [sys.executable, "-m", "metricsearch", "train", "--quiet", "--epochs", "12", "--output-dir", str(tmp_path),
            "--set", "eval.nmi=false", "batches_per_epoch=2", "model.dim=16"]
    # the trainer waits before step 5 (the first of epoch 3), however fast the machine: Ctrl-C lands there
    # a runner started in the background (`pytest &` in a script) ignores SIGINT, and children inherit that:
    # the training gets Ctrl-C's default handling back, as in a terminal
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "METRICSEARCH_PAUSE_AT_STEP": "5"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    while not seen or "paused before step 5" not in seen[-1]:
        seen.append(proc.stderr.readline())
        assert seen[-1], f"training ended before it paused: {''.join(seen)}"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "--resume" in err
    last = tmp_path / "digits" / "last.pt"
    assert torch.load(last, weights_only=False)["epoch"] == 2
    done = subprocess.run(args + ["--resume"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["epochs"] == 12
    *rows, test = [json.loads(r) for r in (tmp_path / "digits" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == list(range(1, 13)) and test["split"] == "test" and test["epoch"] == 12


def test_listing_into_a_closed_pipe_is_silent() -> None:
    # the reader is gone before anything is written (as `metricsearch losses | head -2` once head has its lines)
    proc = subprocess.Popen([sys.executable, "-m", "metricsearch", "losses"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and err == "", err
    done = subprocess.run(f"{sys.executable} -m metricsearch losses | head -2", shell=True, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.count("\n") == 2 and done.stderr == ""


@pytest.mark.parametrize("command", [["train"], ["export"], ["evaluate"], ["serve"], ["demo"], ["index", "build"]])
def test_help_shows_a_default_only_where_there_is_one(command) -> None:
    done = subprocess.run([sys.executable, "-m", "metricsearch", *command, "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0
    assert "(default: None)" not in done.stdout and "(default: False)" not in done.stdout
    for option in " ".join(done.stdout.split()).split(" --")[1:]:
        assert option.count("default") <= 1, option


def test_export_refuses_to_overwrite_or_to_make_folders(digits_run, tmp_path) -> None:
    out = tmp_path / "m.onnx"
    out.write_bytes(b"keep")
    export = [sys.executable, "-m", "metricsearch", "export", str(digits_run.run_dir), "--out"]
    for target, expected in ((out, "already exists; replace it with --overwrite"),
                             (tmp_path / "no" / "such" / "m.onnx", "does not exist; create it")):
        done = subprocess.run([*export, str(target)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and expected in done.stderr, done.stderr
    assert out.read_bytes() == b"keep" and not (tmp_path / "no").exists()
    done = subprocess.run([*export, str(out), "--overwrite"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["onnx"] == str(out) and out.stat().st_size > 1000
