"""Style gate: `ruff check` (the rules in pyproject.toml's [tool.ruff]) passes on the whole repository."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff not installed: pip install -e '.[dev]'")
def test_ruff_check_passes() -> None:
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_packaged_configs_keep_the_line_length() -> None:
    """The YAML configs, which ruff does not read, keep pyproject.toml's [tool.ruff] line-length."""
    width = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["line-length"]
    long = [f"{path.name}:{number}" for path in sorted((REPO / "configs").glob("*.yaml"))
            for number, line in enumerate(path.read_text().splitlines(), 1) if len(line) > width]
    assert not long, f"lines over {width} columns: {long}"
