"""The strict config: every key of every section is checked before a run directory is made."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from metricsearch.app.cli import main
from metricsearch.models.torch_embedder import build_embedder
from metricsearch.train import losses
from metricsearch.train.config import DEFAULTS, load_config, typed_config, validate_config
from metricsearch.train.optim import build_optimizer, build_schedule
from metricsearch.train.trainer import train


@pytest.mark.parametrize("override, key, close", [
    ("eval.evry=2", "eval.evry", "eval.every"),
    ("optimizer.lrr=1", "optimizer.lrr", "optimizer.lr"),
])
def test_a_typo_exits_2_naming_the_key_and_the_close_one_before_any_run_dir(override, key, close, tmp_path, capsys):
    assert main(["train", "--quiet", "--output-dir", str(tmp_path), "--set", override]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"unknown config key {key} (did you mean {close}?)" in err
    assert not any(tmp_path.iterdir())


def test_a_typo_in_a_subprocess_is_one_line_on_stderr(tmp_path):
    args = [sys.executable, "-m", "metricsearch", "train", "--output-dir", str(tmp_path), "--set", "optimizer.lrr=1"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "metricsearch train: error: unknown config key optimizer.lrr (did you mean optimizer.lr?); "
        "optimizer accepts: name, head_lr, lr, "
    )
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("override, named", [
    ("epoch=3", "epochs"),
    ("model.dimm=8", "model.dim"),
    ("model.preprocessing.sise=32", "model.preprocessing.size"),
    ("model.backbone_params.widht=8", "model.backbone_params.width"),
    ("loss.alpah=1", "loss.alpha"),
    ("sampler.images_per_klass=4", "sampler.images_per_class"),
    ("miner={name: semihard, margn: 0.1}", "miner.margin"),
    ("weighting={name: dro_kl, gama: 0.1}", "weighting.gamma"),
    ("schedule.warmup_epoch=1", "schedule.warmup_epochs"),
    ("augment.degree=5", "augment.degrees"),
    ("eval.batchsize=8", "eval.batch_size"),
])
def test_every_section_suggests_the_close_key(override, named):
    with pytest.raises(ValueError, match=rf"did you mean {named}\?"):
        load_config(None, [override])


@pytest.mark.parametrize("override, message", [
    ("optimizer.name=adamx", "optimizer.name: unknown optimizer 'adamx'. Did you mean adam, adamw?"),
    ("schedule.name=cosin", "schedule.name: unknown schedule 'cosin'. Did you mean cosine"),
    ("augment.name=afine", "augment.name: unknown augmentation 'afine'. Did you mean affine"),
    ("model.backbone=resnet19", "model.backbone: unknown backbone 'resnet19'"),
    ("loss.name=msx", "loss.name: unknown loss 'msx'. Did you mean ms"),
    ("sampler.seed=3", "sampler.seed is not a setting: training passes seed itself (set the top-level key seed)"),
    ("loss.num_classes=3", "loss.num_classes is not a setting"),
    ("weighting.k=10", "weighting.k is set but weighting.name is null"),
    ("loss.name=null", "loss.name is required"),
    ("model=3", "config key model must be a mapping"),
    ("eval.every=0", "eval.every must be an integer >= 1, got 0"),
    ("log_every=0.5", "log_every must be an integer >= 1"),
    ("batches_per_epoch=0", "batches_per_epoch must be an integer >= 1"),
    ("model.preprocessing.ink_width=0", "model.preprocessing.ink_width must be greater than 0, got 0"),
    ("model.preprocessing.ink_fill=1.5", "model.preprocessing.ink_fill must be less than or equal to 1, got 1.5"),
    ("amp=on", "config key amp must be 'auto', 'off', 'bf16' or 'fp16', got 'on'"),
    ("split=train", "config key split must be 'test', 'swap' or 'all', got 'train'"),
    ("channels_last=maybe", "config key channels_last must be auto, true or false, got 'maybe'"),
    ("model.preprocessing.ink_fill=true", "model.preprocessing.ink_fill must not be true or false, got true"),
    ("optimizer.lr=yes", "config key optimizer.lr must not be true or false, got true"),
    ("seed=false", "config key seed must not be true or false, got false"),
])
def test_wrong_names_and_values_are_value_errors(override, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config(None, [override])


def test_amp_off_as_yaml_reads_it_a_bare_word_from_a_file_or_set(tmp_path):
    (tmp_path / "off.yaml").write_text("amp: off\n")
    assert typed_config(load_config(tmp_path / "off.yaml")).amp == "off"
    assert typed_config(load_config(None, ["amp=bf16", "amp=off"])).amp == "off"


def test_optional_components_and_a_new_name_drop_the_old_parameters():
    config = load_config(None, ["weighting={name: dro_kl, gamma: 0.5}", "weighting.name=null", "miner=null"])
    assert config["weighting"] == {"name": None} and config["miner"] is None
    config = load_config(None, ["schedule={name: step, gamma: 0.5}", "optimizer.name=sgd", "optimizer.momentum=0.8"])
    assert config["schedule"] == {"name": "step", "gamma": 0.5}
    assert config["optimizer"]["weight_decay"] == DEFAULTS["optimizer"]["weight_decay"]


def test_invalid_yaml_is_a_one_line_value_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nloss: {name: ms\nepochs: 2\n")
    with pytest.raises(ValueError, match=r"bad\.yaml is not valid YAML: .* at line 3, column 7") as info:
        load_config(path)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="--set loss is not valid YAML") as info:
        load_config(None, ["loss={name: [ms"])
    assert "\n" not in str(info.value)


def test_invalid_yaml_in_a_config_file_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\n  epochs: 2\n")
    assert main(["train", "--config", str(path), "--output-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not valid YAML" in err
    assert not (tmp_path / "runs").exists()


def test_the_shipped_configs_are_valid(repo):
    for path in sorted((repo / "configs").glob("*.yaml")):
        validate_config(load_config(path))


def test_train_validates_a_config_built_in_code_before_the_run_dir(tmp_path):
    config = load_config(None, [f"output_dir={tmp_path}"])
    config["eval"]["evry"] = 2
    with pytest.raises(ValueError, match="eval.evry"):
        train(config, progress=False)
    del config["eval"]["evry"]
    del config["log_every"]
    with pytest.raises(ValueError, match="lacks key"):
        train(config, progress=False)
    assert not any(tmp_path.iterdir())


def test_optimizer_groups_and_schedules_by_name():
    model, loss = build_embedder({"dim": 4}), losses.build("ms")
    opt = build_optimizer({"name": "sgd", "lr": 0.1, "head_lr": 0.5}, model, loss)
    assert isinstance(opt, torch.optim.SGD) and [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    assert opt.param_groups[0]["momentum"] == 0.9
    steps, epochs = 10, 4

    def factors(section: dict) -> list[float]:
        scheduler = build_schedule(section, build_optimizer({"name": "adam", "lr": 1.0}, model, loss), steps, epochs)
        return [scheduler.lr_lambdas[0](step) for step in range(steps * epochs)]

    assert factors({"name": "constant", "warmup_epochs": 0.5})[:6] == [0.2, 0.4, 0.6, 0.8, 1.0, 1.0]
    step = factors({"name": "step", "every_epochs": 1, "gamma": 0.5})
    assert step[9] == 1.0 and step[10] == 0.5 and step[39] == 0.125
    cosine = factors({"name": "cosine", "warmup_epochs": 1, "min_factor": 0.1})
    assert cosine[:2] == [0.1, 0.2] and cosine[10] == 1.0 and cosine[-1] == pytest.approx(0.1, abs=0.01)
    assert all(a >= b for a, b in zip(cosine[10:], cosine[11:]))


def _train(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "metricsearch", "train", "--quiet", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


@pytest.mark.parametrize("args, expected", [
    (["--set", "model.dim=abc"], "config key model.dim must be an integer >= 1, got 'abc'"),
    (["--set", "optimizer.lr=abc"], "config key optimizer.lr must be a valid number, got 'abc'"),
    (["--set", "loss.alpha=[1]"], "config key loss.alpha must be a valid number, got [1]"),
    (["--set", "eval.nmi=maybe"], "config key eval.nmi must be a valid boolean, got 'maybe'"),
    (["--set", "model.backbone_params.width=wide"], "config key model.backbone_params.width must be a valid integer"),
    (["--config", "omniglot", "--set", "model.backbone_params.pool=mean"],
     "config key model.backbone_params.pool must be 'avg' or 'max', got 'mean'"),
    (["--set", "model.tta_symmetries=[rot45]"], "config key model.tta_symmetries[0] must be 'rot90', 'rot180', "
                                                 "'rot270', 'flip_lr', 'flip_tb', 'transpose' or 'transverse', got "
                                                 "'rot45'"),
    (["--set", "model.tta_symmetries=[rot90, rot90]"],
     "config key model.tta_symmetries names a symmetry twice: ['rot90', 'rot90']"),
    (["--set", "model.tta_symmetries=[rot90]", "model.normalize=false"],
     "config key model.tta_symmetries puts L2-normalised embeddings side by side: set model.normalize: true"),
    (["--set", "sampler.classes_per_batch=2.5"],
     "config key sampler.classes_per_batch must be a valid integer, got 2.5"),
    (["--set", "device=gpu"], "config key device: device must be one of auto, cpu, cuda or cuda:N, got 'gpu'"),
    (["--set", "augment={name: batch_affine, scale: [1.2, 1.0]}"],
     "batch_affine: scale must be [low, high] with 0 < low <= high, got [1.2, 1.0]"),
    (["--set", "distill.epoch=2"], "unknown config key distill.epoch (did you mean distill.epochs?); distill accepts: "
                                   "epochs, weight, lr, shifts, rotations"),
    (["--set", "distill.shifts=[[0, 0], [3]]"], "config key distill.shifts[1]: has too few items, got [3]"),
    (["--set", "distill.lr=0"], "config key distill.lr must be greater than 0, got 0"),
    (["--set", "distill.weight=-1"], "config key distill.weight must be greater than or equal to 0, got -1"),
    (["--set", "batch_size=64"], "unknown config key batch_size; a training batch is sampler.classes_per_batch x "
                                 "sampler.images_per_class images"),
    (["--config", "some.png"], "config file some.png is not a YAML text file"),
    (["--config", "nosuch"], "config file nosuch not found; give a YAML file or a packaged config name: "),
])
def test_a_wrong_value_or_file_exits_2_with_one_line_naming_it(args, expected, tmp_path):
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "some.png")
    done = _train(tmp_path, "--output-dir", str(tmp_path / "runs"), *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"metricsearch train: error: {expected}"), lines
    assert not (tmp_path / "runs").exists()


def test_batch_size_lists_the_valid_top_level_keys():
    with pytest.raises(ValueError, match="the top level accepts: name, output_dir, .*, sampler, .*, epochs"):
        load_config(None, ["batch_size=64"])


def test_a_packaged_config_by_name_from_any_folder(tmp_path):
    assert load_config("omniglot")["model"]["tta_shifts"][1] == [3, 3]
    assert load_config("omniglot")["model"]["tta_symmetries"] == ["transpose", "rot180", "transverse"]
    assert load_config("omniglot")["model"]["backbone_params"] == {"width": 48, "pool": "max", "pool_first": True}
    done = _train(tmp_path, "--config", "digits", "--output-dir", "runs", "--epochs", "1",
                  "--set", "batches_per_epoch=1", "eval.nmi=false", "model.dim=8")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "runs" / "digits" / "last.pt").is_file()
    (tmp_path / "digits").write_text("name: mine\nepochs: 1\n")  # a file of that name wins over the packaged one
    assert load_config(tmp_path / "digits")["name"] == "mine"


def test_train_help_names_every_packaged_config(capsys):
    from metricsearch.train.config import packaged_configs

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    assert all(re.search(rf"\b{name}\b", text) for name in packaged_configs()), (packaged_configs(), text)


def test_the_defaults_are_the_packaged_digits_recipe(repo):
    recipe = load_config(repo / "configs" / "digits.yaml")
    assert load_config() == recipe == DEFAULTS


def test_a_run_that_exists_names_the_python_arguments_from_python_and_the_flags_from_the_cli(tmp_path):
    from metricsearch.train import RunExistsError

    (tmp_path / "digits").mkdir()
    (tmp_path / "digits" / "last.pt").write_bytes(b"")
    with pytest.raises(RunExistsError, match=r"pass resume=True to continue it, overwrite=True to replace it"):
        train(load_config(None, [f"output_dir={tmp_path}", "model.dim=8"]), progress=False)
    done = _train(tmp_path, "--output-dir", str(tmp_path), "--set", "model.dim=8")
    assert done.returncode == 2
    assert "pass --resume to continue it, --overwrite to replace it" in done.stderr
    assert "resume=True" not in done.stderr


def test_a_new_backbone_drops_the_base_recipes_preprocessing() -> None:
    # the digits base sets 28 px gray for small_cnn; a photo backbone must get its own ImageNet preprocessing
    photo = load_config(None, ["model.backbone=efficientnet_lite0"])["model"]
    assert photo["preprocessing"] == {} and photo["backbone_params"] == {}
    sized = load_config(None, ["model={backbone: 'timm:resnet18', preprocessing: {size: 160}}"])["model"]
    assert sized["preprocessing"] == {"size": 160}
    same = load_config(None, ["model.backbone=small_cnn", "model.dim=16"])["model"]
    assert same["preprocessing"]["size"] == 28 and same["dim"] == 16


def test_input_paths_in_a_config_file_are_from_its_folder_outputs_and_overrides_from_the_current_one(tmp_path,
                                                                                                      monkeypatch):
    from PIL import Image

    from metricsearch.data import load_split

    sub = tmp_path / "sub"
    for name in ("a", "b", "c", "d"):
        (sub / "photos" / name).mkdir(parents=True)
        for i in range(2):
            Image.new("L", (8, 8), 60 * i).save(sub / "photos" / name / f"{i}.png")
    (sub / "recipe.yaml").write_text("dataset: folder:photos\nsplit_classes: 0.5\noutput_dir: runs\n"
                                     "model: {pretrained: weights/net.pt}\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    config = load_config("../sub/recipe.yaml")
    assert config["dataset"] == f"folder:{sub / 'photos'}"  # from the YAML's folder, not the current one
    assert config["model"]["pretrained"] == str(sub / "weights" / "net.pt")
    assert config["output_dir"] == "runs"  # an output: ./runs where the command runs
    assert len(load_split(config["dataset"], split_classes=config["split_classes"]).train.class_names) == 2
    overridden = load_config("../sub/recipe.yaml", ["dataset=folder:photos", "model.pretrained=imagenet"])
    assert overridden["dataset"] == "folder:photos" and overridden["model"]["pretrained"] == "imagenet"  # --set: as is
    (sub / "absolute.yaml").write_text(f"dataset: grocery:{tmp_path}/g#half1\nmodel: {{pretrained: imagenet}}\n")
    config = load_config(sub / "absolute.yaml")
    assert config["dataset"] == f"grocery:{tmp_path}/g#half1" and config["model"]["pretrained"] == "imagenet"


def test_a_run_saved_with_a_relative_data_path_resumes_from_a_config_that_names_it_absolutely(tmp_path, monkeypatch):
    from metricsearch.train.run_dir import prepare_run_dir

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "old"
    run.mkdir(parents=True)
    (run / "last.pt").write_bytes(b"")
    old = load_config("digits", ["dataset=folder:photos", "name=old"])  # --set values stay relative to here
    (run / "config.yaml").write_text(yaml.safe_dump(typed_config(old).model_dump(mode="json"), sort_keys=False))
    (tmp_path / "my.yaml").write_text("dataset: folder:photos\nname: old\n")  # read from the YAML's folder: absolute
    again = typed_config(load_config(str(tmp_path / "my.yaml")))
    assert again.dataset == f"folder:{tmp_path / 'photos'}"
    assert prepare_run_dir(again, resume=True, overwrite=False, write=False) == Path("runs") / "old"
    other = typed_config(load_config(str(tmp_path / "my.yaml"), ["dataset=folder:elsewhere"]))
    with pytest.raises(ValueError, match=r"differs from the run's saved config in \['dataset'\]"):
        prepare_run_dir(other, resume=True, overwrite=False, write=False)
