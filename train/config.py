"""Training configs: the typed schema, the packaged recipes, YAML files and `key=value` overrides, deep-merged."""

from __future__ import annotations

import copy
import difflib
import inspect
import os
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Literal, get_args

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, create_model,
                      field_validator, model_validator)

from metricsearch.models.backbones import BACKBONES, parse_backbone
from metricsearch.models.device import check_device
from metricsearch.models.preprocessing import Preprocessing
from metricsearch.models.torch_embedder import SYMMETRIES
from metricsearch.registry import Registry
from metricsearch.train.augment import AUGMENT_CONTEXT, AUGMENTATIONS
from metricsearch.train.context import CONTEXT_KEYS
from metricsearch.train.losses import LOSSES, learns_proxies
from metricsearch.train.optim import OPTIMIZERS, SCHEDULES
from metricsearch.train.miners import MINERS
from metricsearch.train.samplers import SAMPLERS
from metricsearch.train.weightings import WEIGHTINGS

#: the packaged recipes (configs/NAME.yaml), found by NAME from any folder
CONFIGS = Path(__file__).resolve().parent.parent / "configs"
#: the recipe a config builds on: the digits demo, offline, minutes on a CPU
BASE_RECIPE = "digits"


def _at_least(least: int) -> BeforeValidator:
    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"must be an integer >= {least}")
        return value
    return BeforeValidator(check)


Count = Annotated[int, _at_least(1)]
Device = Annotated[str, BeforeValidator(check_device)]


def _auto_or_bool(value: Any) -> Any:
    """`value` if it is auto, true or false (YAML's on / off / yes / no included); a ValueError otherwise."""
    if value == "auto" or isinstance(value, bool):
        return value
    raise ValueError("must be auto, true or false")


def _switch_word(value: Any) -> Any:
    """`off` for false and `on` for true (YAML reads a bare `off` or `on`, as in `amp: off` or `--set amp=on`, as a
    boolean), else `value`."""
    return ("on" if value else "off") if isinstance(value, bool) else value


#: a `{name: ..., **params}` section; its parameters are typed by the component its name picks
Component = dict[str, Any]


class Section(BaseModel):
    """A config section: unknown keys are errors; numbers given for a text value become text (run names)."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, arbitrary_types_allowed=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_stray_bool(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML's true and false only where a key takes them (pydantic would read true as the number 1)."""
        field = cls.model_fields[info.field_name]
        if isinstance(value, bool) and not any(isinstance(m, BeforeValidator) for m in field.metadata) \
                and not _takes_bool(field.annotation):
            raise ValueError(f"must not be true or false, got {str(value).lower()}")
        return value


def _takes_bool(kind: Any) -> bool:
    """Whether a type admits a boolean: it is bool or Any, or one of its parts is."""
    return kind is bool or kind is Any or any(_takes_bool(part) for part in get_args(kind))


class PreprocessingKeys(Section):
    """The `model.preprocessing` keys a config may set; those it leaves out come from the backbone's own."""

    size: Annotated[int, _at_least(8)] | None = None
    channels: Literal[1, 3] | None = None
    mean: list[float] | None = None
    std: list[float] | None = None
    resize: str | None = None
    crop_ratio: float | None = None
    ink_fill: Annotated[float, Field(gt=0, le=1)] | None = None
    ink_width: Annotated[float, Field(gt=0)] | None = None
    interpolation: str | None = None


#: a name of a symmetry of the square (`model.tta_symmetries`)
Symmetry = Literal[tuple(SYMMETRIES)]  # type: ignore[valid-type]


class ProjectionConfig(Section):
    """The `model.project` section: a PCA projection that `export` appends, fit on the run's training images."""

    dim: Count  # the exported embedding's dimension (docs/photos.md: 256 of 1280 loses nothing measurable)
    whiten: bool = False  # divide each principal direction by its standard deviation


class ModelConfig(Section):
    """The `model` section: the embedder's architecture and its input preprocessing."""

    backbone: str = "small_cnn"  # a registered name, or timm:NAME
    dim: Count | None = 128  # None: no head, the backbone's pooled features are the embedding
    normalize: bool = True
    pretrained: bool | str | None = None  # imagenet (or true): the backbone's published weights; or a file
    backbone_params: dict[str, Any] = Field(default_factory=dict)
    tta_shifts: list[tuple[int, int]] = Field(default_factory=list)
    tta_rotations: list[float] = Field(default_factory=list)  # degrees; each adds a rotated test view
    # symmetries of the square (as augment_classes): each copy's embedding is put beside the images' own
    tta_symmetries: list[Symmetry] = Field(default_factory=list)
    # keys set here replace the backbone's own preprocessing (its ImageNet one; 28 px gray for small_cnn)
    preprocessing: dict[str, Any] = Field(default_factory=dict)
    # N: the backbone's stem and first N blocks keep their pretrained weights and BatchNorm statistics
    freeze: Annotated[int, _at_least(0)] | None = None
    # N > 1: an ensemble of N backbones (each with its own head and loss) in one network and one ONNX graph
    members: Count = 1
    # P in (0, 1]: after training, the embedding is whitened by the training images' within-class scatter ** -P
    whiten: Annotated[float, Field(ge=0.0, le=1.0, strict=True)] = 0.0
    # export appends a PCA projection to project.dim dimensions (`export --dim` overrides; --dim 0: none)
    project: ProjectionConfig | None = None

    @model_validator(mode="after")
    def _projection_smaller(self) -> "ModelConfig":
        """model.project.dim below the embedding's dimension, where the config fixes it."""
        if self.project is not None and self.dim is not None and self.project.dim >= self.dim:
            raise ValueError(f"model.project.dim ({self.project.dim}) must be below model.dim ({self.dim})")
        return self


class EvalConfig(Section):
    """The `eval` section: how often to evaluate on the validation classes (`val_classes`), and what to measure there
    and on the test classes, which are scored once, after the last epoch."""

    every: Count = 1
    batch_size: Count = 256
    recall_k: list[Count] | None = None  # None: the data set's own K values
    nmi: bool = True
    one_shot_ways: Annotated[int, _at_least(2)] | None = None  # the test classes' N-way one-shot accuracy


class MemoryConfig(Section):
    """The `memory` section: a cross-batch memory of recent embeddings as extra references (XBM)."""

    size: Annotated[int, _at_least(0)] = 0  # embeddings of earlier batches kept; 0: no memory
    start_epoch: Annotated[int, _at_least(0)] = 1  # the bank counts from this epoch on (0: from the first step)


class DistillConfig(Section):
    """The `distill` section: epochs after the training's own that pull each image's embedding toward its test-time
    views' mean (train/distill.py)."""

    epochs: Annotated[int, _at_least(0)] = 0  # 0: no distillation
    weight: Annotated[float, Field(ge=0.0)] = 10.0  # of the mean 1 - cosine to the targets, beside the loss
    lr: Annotated[float, Field(gt=0.0)] = 0.0002  # every parameter group's rate, falling by a cosine to 1% of it
    # the targets' views (null: the model's tta_shifts, tta_rotations); more than the test's cost nothing at test time
    shifts: list[tuple[int, int]] | None = None
    rotations: list[float] | None = None

    def views(self, model: ModelConfig) -> tuple[list[tuple[int, int]], list[float]]:
        """The targets' shifts and rotations: this section's, else the model's test-time views."""
        return (model.tta_shifts if self.shifts is None else self.shifts,
                model.tta_rotations if self.rotations is None else self.rotations)


class EmaConfig(Section):
    """The `ema` section: an exponential moving average of the weights over the run's own epochs, which takes their
    place when those epochs end, before the whitening and the distillation (train/ema.py)."""

    span: Annotated[float, Field(ge=0.0)] = 0.0  # epochs: each step weighs the new weights 1 / (span x steps); 0: off
    start_epoch: Annotated[int, _at_least(0)] = 0  # the average starts as the weights at this epoch's start


class LoggingConfig(Section):
    """The `logging` section: where a run's numbers go besides metrics.jsonl."""

    tensorboard: bool = False  # true: TensorBoard event files in RUN_DIR/tensorboard/ (train/tensorboard_log.py)


class TrainConfig(Section):
    """A whole training config, typed; `load_config` builds one over the packaged digits recipe."""

    name: str = BASE_RECIPE
    output_dir: str = "runs"
    seed: int = 0
    device: Device = "auto"
    dataset: str = "digits"
    split_classes: float | None = None
    split: Literal["test", "swap", "all"] = "test"  # swap: train and test exchanged; all: final fit, no test
    # this fraction of the training classes (drawn with `seed`) is not trained on: best.pt is the epoch of their best
    # Recall@1; 0, a final fit, or fewer than 2 of them (or of the classes left to train): best.pt is the last epoch
    val_classes: Annotated[float, Field(ge=0.0, lt=1.0, strict=True)] = 0.2
    augment_classes: list[str] = Field(default_factory=list)  # e.g. [rot90, rot180]: transformed copies as classes
    download: bool = False
    model: ModelConfig = Field(default_factory=ModelConfig)
    augment: Component
    sampler: Component
    miner: Component | None = None
    weighting: Component | None = None
    loss: Component
    optimizer: Component
    schedule: Component
    epochs: Count
    batches_per_epoch: Count | None = None
    amp: Annotated[Literal["auto", "off", "bf16", "fp16"], BeforeValidator(_switch_word)] = "auto"
    # channels-last weights and batches: auto = on CUDA; true also on the CPU (faster there with oneDNN, but
    # check the model's gradients: docs/command-line.md)
    channels_last: Annotated[Literal["auto"] | bool, BeforeValidator(_auto_or_bool)] = "auto"
    # freed memory kept in the heap while training (glibc): auto = on a CPU, where steps then reuse pages
    keep_heap: Annotated[Literal["auto"] | bool, BeforeValidator(_auto_or_bool)] = "auto"
    num_workers: Annotated[int, _at_least(0)] = 0
    cache_images: bool = True
    # V > 0 (with model.freeze): the frozen trunk's outputs for V augmented copies of each training image are
    # computed once, before the first epoch; every step then runs only the trainable rest on one of them
    trunk_cache: Annotated[int, _at_least(0)] = 0
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    distill: DistillConfig = Field(default_factory=DistillConfig)
    ema: EmaConfig = Field(default_factory=EmaConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log_every: Count = 50
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @property
    def all_epochs(self) -> int:
        """The epochs a run trains: its own, then the distillation's."""
        return self.epochs + self.distill.epochs

    def component(self, section: str) -> tuple[str | None, dict[str, Any]]:
        """(name, parameters) of a `{name: ..., **params}` section such as loss, sampler or miner."""
        return component({section: getattr(self, section)}, section)


#: model keys that belong to its backbone: a new `model.backbone` drops the ones the base recipe set
BACKBONE_KEYS = ("preprocessing", "backbone_params")
#: sections naming a component: a new `name` there drops the old component's parameters
COMPONENTS = ("loss", "sampler", "miner", "weighting", "schedule", "augment")

#: the sections that pick a component by name from a registry: the registry, the parameters training
#: passes the component itself (never set in a config), and the section's keys besides the parameters
SECTIONS: dict[str, tuple[Registry[Any], tuple[str, ...], tuple[str, ...]]] = {
    "loss": (LOSSES, CONTEXT_KEYS, ()),
    "sampler": (SAMPLERS, ("labels", "groups", "seed", "batches_per_epoch", "rank", "world_size"), ()),
    "miner": (MINERS, (), ()),
    "weighting": (WEIGHTINGS, CONTEXT_KEYS, ()),
    "optimizer": (OPTIMIZERS, ("params",), ("head_lr",)),
    "schedule": (SCHEDULES, ("steps_per_epoch", "epochs"), ()),
    "augment": (AUGMENTATIONS, AUGMENT_CONTEXT, ()),
}
#: the sections of fixed keys besides `model` (whose keys check_model checks)
PLAIN_SECTIONS: dict[str, type[Section]] = {"eval": EvalConfig, "logging": LoggingConfig, "memory": MemoryConfig,
                                            "distill": DistillConfig, "ema": EmaConfig}
#: sections whose component may be left out (name: null)
OPTIONAL = ("miner", "weighting")
#: what a user may mean by a top-level key that does not exist
HINTS = {"batch_size": "a training batch is sampler.classes_per_batch x sampler.images_per_class "
                       "images, eval.batch_size the evaluation batch",
         "lr": "set optimizer.lr", "dim": "set model.dim", "backbone": "set model.backbone"}


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with `update` merged in, recursively for nested dicts."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if (key == "model" and isinstance(value, dict) and isinstance(out.get(key), dict)
                and value.get("backbone", out[key].get("backbone")) != out[key].get("backbone")):
            out[key] = {k: v for k, v in out[key].items() if k not in BACKBONE_KEYS}
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


def packaged_configs() -> list[str]:
    """Names of the recipes shipped in the package (configs/NAME.yaml)."""
    return sorted(p.stem for p in CONFIGS.glob("*.yaml"))


def config_path(name_or_path: str | Path) -> Path:
    """The YAML file of a config: a path, else the packaged recipe of that name (`digits`, `omniglot`, ...)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    packaged = CONFIGS / f"{name_or_path}.yaml"
    if path.suffix == "" and path.name == str(name_or_path) and packaged.is_file():
        return packaged
    raise FileNotFoundError(f"config file {path} not found; give a YAML file or a packaged config name: "
                            f"{', '.join(packaged_configs())}")


def read_config_file(path: Path) -> dict[str, Any]:
    """The mapping a YAML config file holds, its input paths made absolute from the file's folder
    (`resolve_input_paths`); a one-line ValueError naming the file where it holds none."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"config file {path} is not a YAML text file (it is not UTF-8 text); "
                         "expected a .yaml file such as configs/digits.yaml") from None
    if "\x00" in text:
        raise ValueError(f"config file {path} is not a YAML text file (it holds binary data)")
    loaded = parse_yaml(text, f"config file {path}") or {}
    if not isinstance(loaded, dict):
        raise ValueError(f"config file {path} must hold a YAML mapping of config keys, got {type(loaded).__name__} "
                         f"{_short(loaded)}")
    return resolve_input_paths(loaded, path.absolute().parent)


def resolve_input_paths(values: dict[str, Any], folder: Path) -> dict[str, Any]:
    """`values` with the relative paths of the keys that read files (a `dataset` spec's PATH, a weights file in
    `model.pretrained`) made absolute from `folder`, as a config file's are from its own folder; the keys
    a run writes to (`output_dir`) stay relative to the current folder, as `--set` values all do."""
    out = copy.deepcopy(values)
    dataset = out.get("dataset")
    if isinstance(dataset, str):
        kind, sep, spec_path = dataset.partition(":")  # KIND:PATH; digits and the embedded omniglot have no PATH
        if sep and spec_path.strip():
            out["dataset"] = f"{kind}:{_from_folder(folder, spec_path.strip())}"
    model = out.get("model")
    if isinstance(model, dict) and isinstance(model.get("pretrained"), str) \
            and model["pretrained"] not in ("", "imagenet"):
        model["pretrained"] = _from_folder(folder, model["pretrained"])
    return out


def _from_folder(folder: Path, path: str) -> str:
    """`path` as it is where absolute (or from the home folder, ~), else joined to `folder` and normalised."""
    if Path(path).expanduser().is_absolute():
        return path
    return os.path.normpath(folder / path)


def _defaults() -> dict[str, Any]:
    """The schema's defaults under the packaged base recipe: what a config without a file resolves to."""
    general = {k: f.get_default(call_default_factory=True) for k, f in TrainConfig.model_fields.items()
               if not f.is_required()}
    general = {k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v for k, v in general.items()}
    return deep_merge(general, read_config_file(CONFIGS / f"{BASE_RECIPE}.yaml"))


#: the resolved config without a file: the schema's defaults and configs/digits.yaml, its one source
DEFAULTS: dict[str, Any] = _defaults()


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The resolved, validated config: defaults, the YAML file (a path or a packaged name), each override in order.

    Relative input paths in the file (a data set spec's PATH, a `model.pretrained` weights file) are from the file's
    folder, as a CSV list's image paths are from the CSV's; `output_dir` and every `overrides` value (`--set`) are
    from the current folder."""
    config = copy.deepcopy(DEFAULTS)
    if path is not None:
        config = deep_merge(config, read_config_file(config_path(path)))
    for text in overrides:
        config = deep_merge(config, parse_override(text))
    return typed_config(config).model_dump(mode="json")


def component(config: dict[str, Any], section: str) -> tuple[str | None, dict[str, Any]]:
    """(name, parameters) of a `{name: ..., **params}` section such as loss, sampler or miner."""
    params = dict(config.get(section) or {})
    return params.pop("name", None), params


def validate_config(config: dict[str, Any]) -> None:
    """Raise a one-line ValueError naming the first key, or the first value of a wrong type, in `config`."""
    typed_config(config)


def typed_config(config: dict[str, Any]) -> TrainConfig:
    """`config` checked key by key and value by value against the schema and the components it names."""
    check_keys(config, TrainConfig.model_fields, "")
    missing = [key for key in DEFAULTS if key not in config]
    if missing:
        raise ValueError(f"the config lacks key(s) {', '.join(missing)}; build it with load_config")
    for section in ("model", *PLAIN_SECTIONS, *SECTIONS):
        if not isinstance(config[section], dict) and not (section in OPTIONAL and config[section] is None):
            raise ValueError(f"config key {section} must be a mapping, got {config[section]!r}")
    check_model(config["model"])
    for section, schema in PLAIN_SECTIONS.items():
        check_keys(config[section], schema.model_fields, f"{section}.")
    for section, (registry, passed, own) in SECTIONS.items():
        check_component(config, section, registry, passed, own)
    typed = _validated(TrainConfig, config, "")
    if typed.trunk_cache and typed.model.freeze is None:
        raise ValueError("config key trunk_cache caches the frozen trunk's outputs: set model.freeze too "
                         "(the number of leading backbone blocks to freeze), or trunk_cache: 0")
    symmetries = typed.model.tta_symmetries
    if len(set(symmetries)) != len(symmetries):
        raise ValueError(f"config key model.tta_symmetries names a symmetry twice: {symmetries}")
    if symmetries and not typed.model.normalize:
        raise ValueError("config key model.tta_symmetries puts L2-normalised embeddings side by side: set "
                         "model.normalize: true, or drop model.tta_symmetries")
    if typed.memory.size and typed.model.members > 1:
        raise ValueError("memory (a cross-batch memory) keeps one embedding per image: set model.members: 1, "
                         "or memory.size: 0")
    loss = typed.component("loss")[0]
    if typed.model.members > 1 and learns_proxies(loss):
        raise ValueError(f"loss {loss} learns proxies of one embedding, which an ensemble's members would share: "
                         "set model.members: 1, or use a loss of the five papers")
    if typed.ema.span and typed.ema.start_epoch >= typed.epochs:
        raise ValueError(f"config key ema.start_epoch ({typed.ema.start_epoch}) must come before the run's last "
                         f"epoch: set it below epochs ({typed.epochs}), or ema.span: 0")
    return typed


def _validated(schema: type[BaseModel], values: dict[str, Any], where: str) -> Any:
    """`values` validated by `schema`; a one-line ValueError naming the key, the value and what is expected."""
    try:
        return schema.model_validate(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        key, value = [], values
        for part in error["loc"]:  # keep the parts that are config keys or list positions, not type names
            if isinstance(value, dict) and part in value:
                key.append(str(part))
                value = value[part]
            elif isinstance(value, (list, tuple)) and isinstance(part, int) and part < len(value):
                key[-1] += f"[{part}]"
                value = value[part]
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "missing" and isinstance(value, (list, tuple)):  # a pair given one number
            message = "has too few items"
        if message.startswith("Input should be "):  # keep a choice's every option, drop a type's ", unable to ..."
            expected = message.removeprefix("Input should be ")
            message = "must be " + (expected if error["type"] == "literal_error" else expected.split(",")[0])
        text = f"config key {where}{'.'.join(key)}" + (f" {message}" if message.startswith("must") else f": {message}")
        shown = error.get("input", value)  # as the validators saw it: a YAML `on` is 'on', not True
        raise ValueError(text if ", got " in message else f"{text}, got {_short(shown)}") from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
            hint += f"; {HINTS[key]}" if not where and key in HINTS else ""
            known = f"; {where[:-1] if where else 'the top level'} accepts: {', '.join(accepted)}"
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
    if not isinstance(name, str):
        raise ValueError(f"config key {section}.name must be a name ({', '.join(registry.names())}), got {name!r}")
    try:
        accepted = registry.parameters(name)
    except ValueError as exc:
        raise ValueError(f"config key {section}.name: {exc}") from None
    check_keys(params, ["name", *own, *(k for k in accepted if k not in passed)], f"{section}.", passed)
    missing = [k for k, default in accepted.items() if default is inspect.Parameter.empty
               and k not in passed and k not in params]
    if missing:
        raise ValueError(f"config key {section}.{missing[0]} is required by {section} {name!r}")
    own_types = {k: float for k in own}  # head_lr: a learning rate
    _validated(parameter_schema(registry.get(name), passed, own_types), params | {"name": name}, f"{section}.")


def parameter_schema(factory: Callable[..., Any], passed: Iterable[str] = (),
                     extra: dict[str, Any] | None = None) -> type[BaseModel]:
    """A schema of a factory's keyword parameters with their declared types (those training passes left out)."""
    target = factory.__init__ if isinstance(factory, type) else factory
    namespace = getattr(inspect.unwrap(target), "__globals__", {})
    fields: dict[str, Any] = {"name": (str, ...)}
    fields.update({k: (v, None) for k, v in (extra or {}).items()})
    for param in inspect.signature(factory).parameters.values():
        if param.name in passed or param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            continue
        kind = param.annotation
        if isinstance(kind, str):
            try:
                kind = eval(kind, dict(namespace))  # noqa: S307  # a postponed annotation of our own code
            except Exception:  # a type the factory's module cannot name at run time: accept any value
                kind = Any
        kind = Any if kind is param.empty else kind
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (kind, default)
    return create_model(f"{getattr(factory, '__name__', 'Component')}Params", __base__=Section, **fields)


#: the model keys that only change the test-time views: the same weights take others (`export_onnx`'s `views`)
VIEW_KEYS = ("tta_shifts", "tta_rotations", "tta_symmetries")


def check_views(overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`--set` overrides of test-time view keys (model.tta_shifts, ...), validated as the model section's: the keys
    and their JSON values; a one-line ValueError naming any other key or a wrong value."""
    views: dict[str, Any] = {}
    for text in overrides:
        views = deep_merge(views, parse_override(text))
    check_keys(views, ["model"], "")
    model = views.get("model") or {}
    check_keys(model, VIEW_KEYS, "model.")
    typed = _validated(ModelConfig, model, "model.").model_dump(mode="json")
    return {key: typed[key] for key in model}


def check_model(model: dict[str, Any]) -> None:
    """Check the model section's keys, its backbone's parameters and its preprocessing keys."""
    check_keys(model, ModelConfig.model_fields, "model.")
    try:
        name, fixed = parse_backbone(model.get("backbone", DEFAULTS["model"]["backbone"]))
        factory = BACKBONES.get(name)
    except ValueError as exc:
        raise ValueError(f"config key model.backbone: {exc}") from None
    # the embedder passes them from the preprocessing, model.pretrained and the backbone spec (timm:NAME)
    passed = ("in_channels", "pretrained", *fixed)
    accepted = BACKBONES.parameters(name)
    backbone_params = model.get("backbone_params") or {}
    if not isinstance(backbone_params, dict):
        raise ValueError(f"config key model.backbone_params must be a mapping, got {_short(backbone_params)}")
    check_keys(backbone_params, [k for k in accepted if k not in passed], "model.backbone_params.", passed)
    _validated(parameter_schema(factory, passed), {"name": "backbone", **backbone_params}, "model.backbone_params.")
    preprocessing = model.get("preprocessing") or {}
    if not isinstance(preprocessing, dict):
        raise ValueError(f"config key model.preprocessing must be a mapping, got {_short(preprocessing)}")
    check_keys(preprocessing, Preprocessing.__dataclass_fields__, "model.preprocessing.")
    _validated(PreprocessingKeys, preprocessing, "model.preprocessing.")
