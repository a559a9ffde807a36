"""A run's directory (OUTPUT_DIR/NAME/): made or checked for resuming, its config.yaml and metrics.jsonl, and the
atomic writes of its checkpoints."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from metricsearch.train.config import DEFAULTS, TrainConfig, resolve_input_paths, typed_config

#: resuming may change these keys of a run's config: how long it trains (its own epochs, then the distillation's)
#: and how it logs and keeps freed memory
RESUMABLE_CHANGES = ("epochs", "log_every", "keep_heap", "distill")
#: top-level keys added since some runs were saved, with the value that reproduces those runs (before issue 88 no
#: training classes validated); other added keys compare with their defaults
SAVED_BEFORE = {"val_classes": 0.0}


class RunExistsError(FileExistsError):
    """The run directory already holds a run (and neither resuming nor overwriting was asked for)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(f"{run_dir} already holds a run; pass resume=True to continue it, overwrite=True to "
                         "replace it, or give the config another name for a new run")
        self.run_dir = run_dir


@dataclass
class RunState:
    """What a run has done so far: one metrics row per finished epoch, its best validation Recall@1, and the
    off-the-shelf features' record measured before its first epoch."""

    history: list[dict[str, Any]] = field(default_factory=list)
    best_recall_at_1: float = -1.0
    off_the_shelf: dict[str, Any] | None = None


def prepare_run_dir(settings: TrainConfig, resume: bool, overwrite: bool, write: bool = True) -> Path:
    """OUTPUT_DIR/NAME/ with the config in config.yaml (where `write`); resuming, a ValueError if the config differs
    from the saved one in other keys than RESUMABLE_CHANGES; else a RunExistsError if it holds a run (unless
    `overwrite`)."""
    config = settings.model_dump(mode="json")  # as config.yaml and the checkpoints keep it
    run_dir = Path(settings.output_dir) / settings.name
    last = run_dir / "last.pt"
    if resume:
        if not last.is_file():
            raise FileNotFoundError(f"--resume: {last} does not exist; start the run without --resume")
        # top-level keys added to the schema since the run was saved compare with their defaults (SAVED_BEFORE)
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        saved = typed_config({**DEFAULTS, **SAVED_BEFORE, **saved}).model_dump(mode="json")
        # input paths compare as files: a run saved before config paths were absolute named them from here
        saved, now = (resolve_input_paths(c, Path.cwd()) for c in (saved, config))
        differ = sorted(k for k in set(saved) | set(now)
                        if k not in RESUMABLE_CHANGES and saved.get(k) != now.get(k))
        if differ:
            raise ValueError(
                f"--resume: the config differs from the run's saved config in {differ}; "
                f"only {', '.join(RESUMABLE_CHANGES)} may change when resuming"
            )
    elif last.is_file() and not overwrite:
        raise RunExistsError(run_dir)
    if write:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return run_dir


def write_metrics(run_dir: Path, state: RunState, test: dict[str, Any] | None = None) -> None:
    """metrics.jsonl: the off-the-shelf record (epoch 0) where there is one, a row per epoch, the test record last."""
    rows = [*([state.off_the_shelf] if state.off_the_shelf else []), *state.history, *([test] if test else [])]
    with open(run_dir / "metrics.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def save_atomic(obj: Any, path: Path) -> None:
    """torch.save `obj` to `path` through a temporary file, so that `path` is never half written."""
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)
