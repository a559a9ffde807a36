"""Shared fixtures: the repo and ../shared paths, and one trained digits run reused by several tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: ../shared beside the repository; METRICSEARCH_SHARED points elsewhere (a worktree one level deeper)
SHARED = Path(os.environ.get("METRICSEARCH_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def repo() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture(scope="session")
def omniglot_dir() -> Path:
    """../shared/data/omniglot (or $METRICSEARCH_OMNIGLOT, for a worktree elsewhere), or a skip that says why."""
    path = SHARED / "data" / "omniglot"
    if not path.is_dir() and os.environ.get("METRICSEARCH_OMNIGLOT"):
        path = Path(os.environ["METRICSEARCH_OMNIGLOT"])
    if not path.is_dir():
        pytest.skip(f"{path} not found: the Omniglot tests need ../shared beside the repository")
    return path


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory: pytest.TempPathFactory):
    """The full configs/digits.yaml recipe, trained once per test session."""
    from metricsearch.train.config import load_config
    from metricsearch.train.trainer import train

    out = tmp_path_factory.mktemp("runs")
    config = load_config(REPO / "configs" / "digits.yaml", [f"output_dir={out}"])
    return train(config, progress=False)


@pytest.fixture(scope="session")
def digits_onnx(digits_run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits run exported to ONNX once per test session."""
    from metricsearch.train import export_onnx

    return export_onnx(digits_run.run_dir, tmp_path_factory.mktemp("onnx") / "digits.onnx").path
