"""Training configs: built-in defaults, YAML files and `key=value` overrides, deep-merged."""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any

import yaml

#: The embedded default: the digits recipe (configs/digits.yaml says the same), offline, minutes on a CPU.
DEFAULTS: dict[str, Any] = {
    "name": "digits",
    "output_dir": "runs",
    "seed": 0,
    "device": "auto",
    "dataset": "digits",
    "split_classes": None,
    "split": "test",  # test | swap (train and test exchanged) | all (final fit: every class trains, no test)
    "augment_classes": [],  # e.g. [rot90, rot180, rot270]: transformed copies of the training classes as new classes
    "download": False,
    "model": {
        "backbone": "small_cnn",
        "dim": 128,
        "normalize": True,
        "pretrained": None,
        "backbone_params": {},
        "tta_shifts": [],
        "preprocessing": {"size": 28, "channels": 1, "mean": [0.5], "std": [0.5], "resize": "stretch"},
    },
    "augment": {"name": "affine", "degrees": 10, "translate": [0.1, 0.1], "scale": [0.9, 1.1], "fill": 0},
    "sampler": {"name": "group", "classes_per_batch": 5, "images_per_class": 16},
    "miner": {"name": None},
    "weighting": {"name": None},
    "loss": {"name": "ms"},
    "optimizer": {"name": "adamw", "lr": 5e-5, "head_lr": 5e-4, "weight_decay": 1e-4},
    "schedule": {"name": "cosine", "warmup_epochs": 0},
    "epochs": 4,
    "batches_per_epoch": None,
    "amp": "auto",
    "num_workers": 0,
    "cache_images": True,
    "eval": {"every": 1, "batch_size": 256, "recall_k": None, "nmi": True, "one_shot_ways": None},
}


#: sections naming a component: a new `name` there drops the old component's parameters
COMPONENTS = ("loss", "sampler", "miner", "weighting", "schedule", "augment")


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with `update` merged in, recursively for nested dicts."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        renamed = (key in COMPONENTS and isinstance(value, dict) and isinstance(out.get(key), dict)
                   and "name" in value and value["name"] != out[key].get("name"))
        if isinstance(value, dict) and isinstance(out.get(key), dict) and not renamed:
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_override(text: str) -> dict[str, Any]:
    """`a.b=value` as a nested dict; the value is parsed as YAML (numbers, lists, null, ...)."""
    if "=" not in text:
        raise ValueError(f"--set expects key=value, got {text!r}")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ValueError(f"--set has an empty key in {text!r}")
    value: Any = yaml.safe_load(raw) if raw != "" else ""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def _check_keys(config: dict[str, Any], reference: dict[str, Any], where: str = "") -> None:
    for key in config:
        if key not in reference:
            close = difflib.get_close_matches(key, reference, n=1)
            hint = f" (did you mean {where}{close[0]}?)" if close else ""
            raise ValueError(f"unknown config key {where}{key!r}{hint}")
        if key in ("model",) and isinstance(config[key], dict):
            _check_keys({k: v for k, v in config[key].items() if k != "preprocessing"},
                        reference[key], f"{where}{key}.")


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The resolved config: defaults, then the YAML file, then each override in order."""
    config = copy.deepcopy(DEFAULTS)
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} not found (see configs/ for examples)")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path} must hold a YAML mapping at the top level")
        _check_keys(loaded, DEFAULTS)
        config = deep_merge(config, loaded)
    for text in overrides:
        update = parse_override(text)
        _check_keys(update, DEFAULTS)
        config = deep_merge(config, update)
    return config


def component(config: dict[str, Any], section: str) -> tuple[str | None, dict[str, Any]]:
    """(name, parameters) of a `{name: ..., **params}` section such as loss, sampler or miner."""
    params = dict(config.get(section) or {})
    return params.pop("name", None), params
