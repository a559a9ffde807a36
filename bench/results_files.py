"""Where a bench script keeps its results: the printed table as RESULTS.md, the raw numbers as RESULTS.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_results(path: Path, text: str, data: Any) -> None:
    """Write `text` to PATH.md and `data` as JSON to PATH.json (the folder made if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".md").write_text(text.rstrip("\n") + "\n")
    path.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
