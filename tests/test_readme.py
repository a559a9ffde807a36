"""The README: its Python API and client examples run as written, and its links and the docs' links resolve."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_block(heading: str) -> str:
    """The first ```python block under a README heading."""
    text = (REPO / "README.md").read_text()
    section = text.split(f"## {heading}\n", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no python block under {heading}"
    return match.group(1)


def test_python_api_example_runs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", readme_block("Python API")], cwd=tmp_path,  # outside the repo
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    best, r1, map_at_r = map(float, done.stdout.split())
    assert (tmp_path / "api.onnx").is_file() and (tmp_path / "runs" / "api" / "best.pt").is_file()
    assert abs(best - r1) <= 0.005 and 0.0 < map_at_r <= 1.0
    again = subprocess.run([sys.executable, "-c", readme_block("Python API")], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
    last = again.stderr.strip().splitlines()[-1]
    assert last.startswith("metricsearch.train.trainer.RunExistsError") and "overwrite=True" in last, last
    assert "--overwrite" not in last


def test_web_page_client_example_runs(server, gallery_items, tmp_path: Path) -> None:
    code = readme_block("Web page")
    assert len([line for line in code.splitlines() if line.strip()]) <= 5
    gallery_items[0][2].save(tmp_path / "query.png")
    done = subprocess.run([sys.executable, "-c", code.replace("http://127.0.0.1:7860/", server.url)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]  # after the client's "Loaded as API" line
    assert last.startswith(f"[{{'id': {gallery_items[0][0]}, 'score': "), done.stdout


def relative_links(markdown: Path) -> list[str]:
    """The targets of a Markdown file's relative links and images, without their #anchors."""
    targets = re.findall(r"\]\(([^)\s]+)\)", markdown.read_text())
    return [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:|#", t)]


def test_readme_and_docs_links_resolve() -> None:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    assert len(files) > 1, "no docs/*.md"
    broken = [f"{f.relative_to(REPO)} -> {target}" for f in files for target in relative_links(f)
              if not (f.parent / target).exists()]
    assert not broken, broken
    assert all(relative_links(f) for f in files[1:]), "every docs page links back to the README"


def test_readme_is_short_and_names_no_local_data() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < 250
    assert "../shared" not in text and "pip install metricsearch" not in text
