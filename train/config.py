"""Training configs: built-in defaults, YAML files and `key=value` overrides, deep-merged."""

from __future__ import annotations

import copy
import difflib
import inspect
from pathlib import Path
from typing import Any, Iterable

import yaml

from metricsearch.models.backbones import BACKBONES, parse_backbone
from metricsearch.models.preprocessing import Preprocessing
from metricsearch.registry import Registry
from metricsearch.train.augment import AUGMENTATIONS
from metricsearch.train.losses import LOSSES
from metricsearch.train.optim import OPTIMIZERS, SCHEDULES
from metricsearch.train.sampling import MINERS, SAMPLERS, WEIGHTINGS

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
        # keys set here replace the backbone's own preprocessing (its ImageNet one; 28 px gray for small_cnn)
        "preprocessing": {},
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
    "log_every": 50,
    "logging": {"tensorboard": False},  # true: TensorBoard event files in the run directory (train/board.py)
}


#: sections naming a component: a new `name` there drops the old component's parameters
COMPONENTS = ("loss", "sampler", "miner", "weighting", "schedule", "augment")

#: what training passes the losses and weightings about the training set (never set in a config)
DATA_STATS = ("class_counts", "num_classes", "num_images")

#: the sections that pick a component by name from a registry: the registry, the parameters training
#: passes the component itself (never set in a config), and the section's keys besides the parameters
SECTIONS: dict[str, tuple[Registry[Any], tuple[str, ...], tuple[str, ...]]] = {
    "loss": (LOSSES, DATA_STATS, ()),
    "sampler": (SAMPLERS, ("labels", "seed", "batches_per_epoch"), ()),
    "miner": (MINERS, (), ()),
    "weighting": (WEIGHTINGS, ("sampler", *DATA_STATS), ()),
    "optimizer": (OPTIMIZERS, ("params",), ("head_lr",)),
    "schedule": (SCHEDULES, ("steps_per_epoch", "epochs"), ()),
    "augment": (AUGMENTATIONS, ("size",), ()),
}
#: sections whose component may be left out (name: null)
OPTIONAL = ("miner", "weighting")


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
    value: Any = parse_yaml(raw, f"the value of --set {key}") if raw != "" else ""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def parse_yaml(text: str, what: str) -> Any:
    """`text` parsed as YAML; a ValueError in one line, naming `what`, where it is not valid YAML."""
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{what} is not valid YAML: {exc.problem or exc.context}{where}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{what} is not valid YAML: {' '.join(str(exc).split())}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The resolved and validated config: defaults, then the YAML file, then each override in order."""
    config = copy.deepcopy(DEFAULTS)
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} not found (see configs/ for examples)")
        loaded = parse_yaml(path.read_text(), f"config file {path}") or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path} must hold a YAML mapping at the top level")
        config = deep_merge(config, loaded)
    for text in overrides:
        config = deep_merge(config, parse_override(text))
    validate_config(config)
    return config


def component(config: dict[str, Any], section: str) -> tuple[str | None, dict[str, Any]]:
    """(name, parameters) of a `{name: ..., **params}` section such as loss, sampler or miner."""
    params = dict(config.get(section) or {})
    return params.pop("name", None), params


def validate_config(config: dict[str, Any]) -> None:
    """Raise a ValueError naming the first key (and the close name) that nothing in training accepts."""
    check_keys(config, DEFAULTS, "")
    missing = [key for key in DEFAULTS if key not in config]
    if missing:
        raise ValueError(f"the config lacks key(s) {', '.join(missing)}; build it with load_config")
    for section in ("model", "eval", "logging", *SECTIONS):
        if not isinstance(config[section], dict) and not (section in OPTIONAL and config[section] is None):
            raise ValueError(f"config key {section} must be a mapping, got {config[section]!r}")
    check_model(config["model"])
    check_keys(config["eval"], DEFAULTS["eval"], "eval.")
    check_keys(config["logging"], DEFAULTS["logging"], "logging.")
    if not isinstance(config["logging"]["tensorboard"], bool):
        raise ValueError(f"logging.tensorboard must be true or false, got {config['logging']['tensorboard']!r}")
    for section, (registry, passed, own) in SECTIONS.items():
        check_component(config, section, registry, passed, own)
    for key, least in (("epochs", 1), ("log_every", 1), ("num_workers", 0), ("eval.every", 1), ("eval.batch_size", 1)):
        check_integer(config, key, least)
    if config["batches_per_epoch"] is not None:
        check_integer(config, "batches_per_epoch", 1)


def check_keys(section: dict[str, Any], accepted: Iterable[str], where: str, passed: Iterable[str] = ()) -> None:
    """Raise a ValueError for the first key of `section` (at `where`) not in `accepted`, with the close name."""
    accepted = [str(key) for key in accepted]
    for key in section:
        if key in passed:
            hint = f" (set the top-level key {key})" if key in DEFAULTS else ""
            raise ValueError(f"config key {where}{key} is not a setting: training passes {key} itself{hint}")
        if key not in accepted:
            close = difflib.get_close_matches(str(key), accepted, n=1)
            hint = f" (did you mean {where}{close[0]}?)" if close else ""
            known = f"; {where[:-1]} accepts: {', '.join(accepted)}" if where else ""
            raise ValueError(f"unknown config key {where}{key}{hint}{known}")


def check_component(
    config: dict[str, Any], section: str, registry: Registry[Any], passed: tuple[str, ...], own: tuple[str, ...],
) -> None:
    """Check a `{name: ..., **params}` section against the parameters of the component its name picks."""
    name, params = component(config, section)
    if name is None:
        if section not in OPTIONAL:
            raise ValueError(f"config key {section}.name is required; known: {', '.join(registry.names())}")
        if params:
            raise ValueError(f"config key {section}.{next(iter(params))} is set but {section}.name is null; "
                             f"name a {section} or drop the key")
        return
    try:
        accepted = registry.parameters(name)
    except ValueError as exc:
        raise ValueError(f"config key {section}.name: {exc}") from None
    check_keys(params, ["name", *own, *(k for k in accepted if k not in passed)], f"{section}.", passed)
    missing = [k for k, default in accepted.items() if default is inspect.Parameter.empty
               and k not in passed and k not in params]
    if missing:
        raise ValueError(f"config key {section}.{missing[0]} is required by {section} {name!r}")


def check_model(model: dict[str, Any]) -> None:
    """Check the model section, its backbone's parameters and its preprocessing keys."""
    check_keys(model, DEFAULTS["model"], "model.")
    try:
        accepted = BACKBONES.parameters(parse_backbone(model.get("backbone", DEFAULTS["model"]["backbone"]))[0])
    except ValueError as exc:
        raise ValueError(f"config key model.backbone: {exc}") from None
    # the embedder passes them from the preprocessing, model.pretrained and the backbone spec (timm:NAME)
    passed = ("in_channels", "pretrained", "model_name")
    check_keys(model.get("backbone_params") or {}, [k for k in accepted if k not in passed], "model.backbone_params.",
               passed)
    check_keys(model.get("preprocessing") or {}, Preprocessing.__dataclass_fields__, "model.preprocessing.")


def check_integer(config: dict[str, Any], key: str, least: int) -> None:
    """Raise a ValueError unless the config value at dotted `key` is an integer >= `least`."""
    value: Any = config
    for part in key.split("."):
        value = value.get(part)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"config key {key} must be an integer >= {least}, got {value!r}")
