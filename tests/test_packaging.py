"""The wheel ships every sub-package, the configs and the embedded data, and no tests, benches or build files;
the editable install (`pip install -e .`) exposes the same packages."""

from __future__ import annotations

import os
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


def _copy_of_the_tree(parent: Path) -> Path:
    """A copy of the working tree (so no build files land in the repository)."""
    src = parent / "metricsearch"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                                             "runs", "metricsearch-demo", ".pytest_cache"))
    return src


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """A wheel built from a copy of the working tree."""
    src = _copy_of_the_tree(tmp_path_factory.mktemp("src"))
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


def test_the_editable_install_exposes_the_shipped_packages_and_not_tests_or_bench(tmp_path: Path) -> None:
    """`pip install -e .` builds this editable wheel: strict by default, a tree of links to the shipped files."""
    src = _copy_of_the_tree(tmp_path)
    build = "import sys; from setuptools import build_meta; print(build_meta.build_editable(sys.argv[1]))"
    subprocess.run([sys.executable, "-c", build, str(tmp_path / "wheel")], cwd=src, check=True, capture_output=True,
                   timeout=600)
    (path,) = (tmp_path / "wheel").glob("metricsearch-*.whl")
    site_packages = tmp_path / "site-packages"
    with zipfile.ZipFile(path) as editable:
        editable.extractall(site_packages)
    found = ("import importlib.util, site, sys; site.addsitedir(sys.argv[1]); import metricsearch; "
             "print(*(importlib.util.find_spec('metricsearch.' + m) is not None for m in ('index', 'tests', 'bench')))")
    # -S: no other site-packages, so only this install (never the checkout's own editable install) counts
    done = subprocess.run([sys.executable, "-S", "-c", found, str(site_packages)], capture_output=True, text=True,
                          timeout=60, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.stdout.split() == ["True", "False", "False"], done.stdout + done.stderr
