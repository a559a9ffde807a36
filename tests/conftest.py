"""Shared fixtures: the repo and ../shared paths, and one trained digits run reused by several tests."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`-n auto`), each worker and its children get the cores over the workers as threads, so
    the workers do not oversubscribe the CPU (with 2 cores and 2 workers, 2 threads each made the suite slower)."""
    if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
        threads = str(max(1, (os.cpu_count() or 1) // workers))
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[name] = threads


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
def grocery_dir() -> Path:
    """../shared/data/grocery (the Grocery Store photos), or a skip that says why."""
    path = SHARED / "data" / "grocery"
    if not (path / "dataset" / "classes.csv").is_file():
        pytest.skip(f"{path}/dataset not found: the photo tests need ../shared beside the repository")
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


@pytest.fixture(scope="session")
def digits_gallery(digits_onnx: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits test classes indexed with the session's digits model, once per test session."""
    from metricsearch.index import build_gallery

    db = tmp_path_factory.mktemp("gallery") / "digits"
    build_gallery(digits_onnx, "digits", db, part="test")
    return db


@pytest.fixture(scope="session")
def gallery_items(digits_gallery: Path) -> list:
    """(id, label, thumbnail as a PIL image) of 8 items of the digits gallery, two labels alternating."""
    import io

    from PIL import Image

    from metricsearch.index import Gallery

    with Gallery.open(digits_gallery) as gallery:
        by_label: dict = {}
        for item_id in gallery.catalog.ids.tolist():
            label = gallery.item(item_id)["label"]
            if len(by_label.setdefault(label, [])) < 4:
                by_label[label].append((item_id, label, Image.open(io.BytesIO(gallery.thumbnail(item_id))).copy()))
        first, second = list(by_label.values())[:2]
    return [item for pair in zip(first, second) for item in pair]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    return _free_port()


@pytest.fixture(scope="session")
def server(digits_gallery: Path):
    """The search page on 127.0.0.1 over the digits gallery (1 MB upload limit), for client and browser tests."""
    from metricsearch.app.web import serve

    running = serve(digits_gallery, port=_free_port(), max_upload_mb=1, block=False, log=lambda _: None)
    yield running
    running.close()
