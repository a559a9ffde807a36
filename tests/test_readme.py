"""The README: its Python API and client examples run as written, its links and the docs' links resolve, and it and
the docs stay readable guides (line, table cell, paragraph and length limits; the experiment record lives in
bench/results/*/LOG.md)."""

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
    assert last.startswith("metricsearch.train.run_dir.RunExistsError") and "overwrite=True" in last, last
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
    assert len(text.splitlines()) < 250, f"README.md: {len(text.splitlines())} lines, 249 at most"
    assert "../shared" not in text and "pip install metricsearch" not in text


#: the limits a guide keeps: prose lines, table cells, paragraphs (README only) and docs/omniglot.md's length
MAX_LINE, MAX_CELL, MAX_PARAGRAPH, MAX_OMNIGLOT_LINES, MAX_RESULTS_TABLES = 160, 120, 8, 300, 3


def markdown_lines(path: Path) -> list[tuple[int, str, str]]:
    """Each line of a Markdown file with its number and kind: code (fenced, or indented after a blank line), table,
    heading, blank or text."""
    kinds: list[tuple[int, str, str]] = []
    fenced, previous = False, "blank"
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced, kind = not fenced, "code"
        elif fenced or (line.startswith(("    ", "\t")) and previous in ("blank", "code")):
            kind = "code"
        elif not line.strip():
            kind = "blank"
        elif line.lstrip().startswith("|"):
            kind = "table"
        elif line.startswith("#"):
            kind = "heading"
        else:
            kind = "text"
        kinds.append((number, line, kind))
        previous = kind
    return kinds


def table_cells(row: str) -> list[str]:
    """The cells of one Markdown table row (an escaped \\| stays inside its cell)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def long_lines_and_cells(path: Path) -> list[str]:
    """file:line of every prose line over MAX_LINE characters and every table cell over MAX_CELL."""
    name = path.relative_to(REPO)
    found = []
    for number, line, kind in markdown_lines(path):
        if kind in ("text", "heading") and len(line) > MAX_LINE:
            found.append(f"{name}:{number}: a line of {len(line)} characters")
        if kind == "table":
            found += [f"{name}:{number}: a table cell of {len(cell)} characters" for cell in table_cells(line)
                      if len(cell) > MAX_CELL]
    return found


def test_readme_keeps_its_lines_and_table_cells_short() -> None:
    found = long_lines_and_cells(REPO / "README.md")
    assert not found, f"over {MAX_LINE} characters a line or {MAX_CELL} a cell: {found}"


def test_docs_keep_their_lines_and_table_cells_short() -> None:
    found = [item for page in sorted((REPO / "docs").glob("*.md")) for item in long_lines_and_cells(page)]
    assert not found, f"over {MAX_LINE} characters a line or {MAX_CELL} a cell: {found}"


def test_readme_paragraphs_are_short() -> None:
    runs, start, length = [], 0, 0
    for number, _, kind in [*markdown_lines(REPO / "README.md"), (0, "", "blank")]:
        if kind == "text":
            start, length = (start, length + 1) if length else (number, 1)
            continue
        if length > MAX_PARAGRAPH:
            runs.append(f"README.md:{start}: a paragraph of {length} lines")
        length = 0
    assert not runs, f"paragraphs over {MAX_PARAGRAPH} lines: {runs}"


def test_readme_results_are_a_few_short_tables_that_link_to_the_full_ones() -> None:
    lines = markdown_lines(REPO / "README.md")
    heading = next((n for n, line, kind in lines if kind == "heading" and line == "## Results"), None)
    assert heading, "README.md: no '## Results' section"
    section = []
    for number, line, kind in lines[heading:]:
        if kind == "heading" and line.startswith("## "):
            break
        section.append((number, line, kind))
    tables: list[list[tuple[int, str]]] = []
    for (number, line, kind), (_, _, before) in zip(section, [(0, "", "blank"), *section]):
        if kind == "table":
            (tables[-1].append((number, line)) if before == "table" else tables.append([(number, line)]))
    assert 0 < len(tables) <= MAX_RESULTS_TABLES, \
        f"README.md:{heading}: {len(tables)} tables in Results, {MAX_RESULTS_TABLES} at most: " \
        f"{[f'README.md:{table[0][0]}' for table in tables]}"
    unlinked = [f"README.md:{table[0][0]}" for table in tables if not any("](" in line for _, line in table)]
    assert not unlinked, f"Results tables that link to no full table: {unlinked}"
    rows = [f"README.md:{table[0][0]}: {len(table) - 2} rows" for table in tables if len(table) - 2 > 4]
    assert not rows, f"Results tables are short (one row per headline result): {rows}"


def test_the_omniglot_guide_is_a_guide_and_links_to_its_log() -> None:
    page = REPO / "docs" / "omniglot.md"
    length = len(page.read_text().splitlines())
    assert length <= MAX_OMNIGLOT_LINES, f"docs/omniglot.md:{length}: {MAX_OMNIGLOT_LINES} lines at most"
    assert "../bench/results/omniglot/LOG.md" in relative_links(page), "docs/omniglot.md: no link to its LOG.md"
