"""The Dockerfile, parsed as Docker reads it (dockerfile-parse): two targets, serve (the `gpu` extra, no torch)
and train, that install the package from the build context with extras pyproject.toml defines, run as the
non-root user the base stage creates, start `metricsearch` with arguments its own parser accepts, and a
serve port that EXPOSE and the health check agree on; hadolint-clean where hadolint is installed."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from metricsearch.app.cli import build_parser

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")

REPO = Path(__file__).resolve().parents[1]


def targets() -> dict[str, list[dict]]:
    """Each build stage's instructions by stage name, those of the stage it is built FROM first."""
    stages: dict[str, list[dict]] = {}
    current: list[dict] | None = None
    for instruction in DockerfileParser(str(REPO / "Dockerfile")).structure:
        if instruction["instruction"] == "FROM":
            words = instruction["value"].split()
            name = words[2] if len(words) == 3 and words[1].lower() == "as" else words[0]
            current = stages[name] = list(stages.get(words[0], []))
        elif current is not None:
            current.append(instruction)
    return stages


def values(instructions: list[dict], kind: str) -> list[str]:
    return [i["value"] for i in instructions if i["instruction"] == kind]


def installed_extras(instructions: list[dict]) -> set[str]:
    """The extras of every `pip install SRC[extras]` of the package copied into the image (COPY . SRC)."""
    source = next(v.split()[1].rstrip("/") for v in values(instructions, "COPY") if v.split()[0] == ".")
    extras: set[str] = set()
    for run in values(instructions, "RUN"):
        for command in re.split(r"&&|;", run):
            words = shlex.split(command)
            if words[:2] == ["pip", "install"]:
                for word in words[2:]:
                    if word.startswith(source + "[") and word.endswith("]"):
                        extras |= set(word[len(source) + 1:-1].split(","))
    return extras


@pytest.fixture(scope="module")
def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_serve_installs_the_gpu_extra_without_torch_and_train_the_train_extra(project) -> None:
    stages = targets()
    defined = project["optional-dependencies"]
    serve, train = installed_extras(stages["serve"]), installed_extras(stages["train"])
    assert serve == {"gpu"} and train == {"train"}, (serve, train)
    assert (serve | train) <= set(defined)
    torch_free = project["dependencies"] + [r for extra in serve for r in defined[extra]]
    assert not [r for r in torch_free if re.match(r"torch\b", r)], torch_free


def test_targets_run_metricsearch_as_the_created_user_with_arguments_the_cli_accepts(project) -> None:
    stages = targets()
    created = re.search(r"useradd\b.*--uid (\d+)", " ".join(values(stages["base"], "RUN")))
    assert created is not None
    for name in ("serve", "train"):
        assert values(stages[name], "USER")[-1] == created.group(1) != "0", name
        entrypoint = json.loads(values(stages[name], "ENTRYPOINT")[-1])
        assert entrypoint == ["metricsearch"] and "metricsearch" in project["scripts"], name
    args = build_parser().parse_args(json.loads(values(stages["serve"], "CMD")[-1]))
    assert args.command == "serve" and args.host == "0.0.0.0"
    assert values(stages["serve"], "EXPOSE") == [str(args.port)]
    assert f"127.0.0.1:{args.port}/" in values(stages["serve"], "HEALTHCHECK")[-1]
    with pytest.raises(SystemExit) as shown:
        build_parser().parse_args(json.loads(values(stages["train"], "CMD")[-1]))
    assert shown.value.code == 0  # --help


def test_the_build_context_keeps_what_pip_install_needs_and_drops_runs() -> None:
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".git" in ignored and "runs" in ignored and "*.pt" in ignored
    assert not {"pyproject.toml", "setup.py", "README.md", "*.py", "*.toml"} & set(ignored)


def test_hadolint_is_clean() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (it comes with the dev extra: pip install -e '.[dev]')")
    done = subprocess.run([hadolint, "--no-color", str(REPO / "Dockerfile")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
