"""The wheel ships every sub-package, the configs and the embedded data, and no tests, benches or build files."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOT_SHIPPED = {"tests", "bench", "build", "docs", "configs"}


def _packages_in_tree() -> set[str]:
    """metricsearch.* for every folder under the repository root holding an __init__.py, tests and bench aside."""
    found = {"metricsearch"}
    for init in REPO.rglob("__init__.py"):
        rel = init.parent.relative_to(REPO)
        if rel.parts and rel.parts[0] not in NOT_SHIPPED and not any(p.startswith(".") for p in rel.parts):
            found.add(".".join(("metricsearch",) + rel.parts))
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """A wheel built from a copy of the working tree (so no build files land in the repository)."""
    src = tmp_path_factory.mktemp("src") / "metricsearch"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                                             "runs", "metricsearch-demo", ".pytest_cache"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out)], check=True, capture_output=True, timeout=600)
    (path,) = out.glob("metricsearch-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_ships_every_sub_package_and_nothing_else(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    shipped = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert shipped == _packages_in_tree()
    tops = {n.split("/")[1] for n in names if n.startswith("metricsearch/") and n.count("/") >= 2}
    assert not tops & {"tests", "bench", "build"}
    assert "metricsearch/setup.py" not in names


def test_the_wheel_ships_the_configs_and_the_embedded_data(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for config in (REPO / "configs").glob("*.yaml"):
        assert f"metricsearch/configs/{config.name}" in names
    for data in (REPO / "data").glob("*.npz"):
        assert f"metricsearch/data/{data.name}" in names
    entry_points = wheel.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "metricsearch = metricsearch.app.cli:main" in entry_points
