"""The serving side runs without torch or train/: imports flow app -> index -> (train) -> models -> data, evaluation,
with no cycle; renamed modules keep their old paths as deprecated aliases."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: modules that must never import torch or metricsearch.train (directly or through their imports)
TORCH_FREE = ["metricsearch.data", "metricsearch.evaluation", "metricsearch.models",
              "metricsearch.models.onnx_embedder", "metricsearch.models.image_set_embedding", "metricsearch.index",
              "metricsearch.app.cli", "metricsearch.app.web"]
#: which layers each layer may import
ALLOWED = {
    "data": {"data"},
    "evaluation": {"evaluation", "data"},
    "models": {"models", "data", "evaluation"},
    "train": {"train", "models", "data", "evaluation"},
    "index": {"index", "models", "data", "evaluation"},
    "app": {"app", "index", "train", "models", "data", "evaluation"},
}
SHARED_TOP = {"registry", "errors"}
NOT_SHIPPED = {"tests", "bench", "build"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_the_layers_below(layer: str) -> None:
    wrong = []
    for path in sorted((REPO / layer).rglob("*.py")):
        for module in _imports(path):
            parts = module.split(".")
            if parts[0] != "metricsearch" or len(parts) < 2 or parts[1] in SHARED_TOP:
                continue
            if parts[1] not in ALLOWED[layer]:
                wrong.append(f"{path.relative_to(REPO)} imports {module}")
            if layer in ("data", "evaluation", "index") and parts[1] == "train":
                wrong.append(f"{path.relative_to(REPO)} imports {module}")
        if layer in ("data", "evaluation", "index") and any(m.split(".")[0] == "torch" for m in _imports(path)):
            wrong.append(f"{path.relative_to(REPO)} imports torch")
    assert not wrong, "\n".join(wrong)


def _module_names() -> dict[str, Path]:
    """Every shipped module (metricsearch.*, tests and bench aside) and its file."""
    names = {}
    for path in sorted(REPO.rglob("*.py")):
        rel = path.relative_to(REPO)
        in_packages = all((folder / "__init__.py").is_file() for folder in path.parents if REPO in folder.parents)
        if rel.parts[0] in NOT_SHIPPED or rel == Path("setup.py") or not in_packages:
            continue
        parts = ("metricsearch", *rel.with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_edges(module: str, source: str, is_package: bool, known: set[str]) -> set[str]:
    """The metricsearch modules that `module` imports anywhere in `source` (function-local imports too, relative
    ones resolved), each with the packages above it (importing a.b.c runs a and a.b first); a package's own
    submodules, which its __init__ imports to re-export them, are left out of its edges."""
    package = module if is_package else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from .x (level 1: this package), from ..x (level 2: the one above), ...
                above = package.rsplit(".", node.level - 1)[0]
                base = f"{above}.{base}" if base else above
            targets |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names}
    edges = set()
    for target in targets:
        parts = target.split(".")
        edges |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & known
    return {e for e in edges if e != module and not (is_package and e.startswith(module + "."))}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph` as the modules along it (the first one again at the end), or [] when it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


def import_graph(sources: dict[str, str] | None = None) -> dict[str, set[str]]:
    """module -> the metricsearch modules it imports, from the files (or from `sources`' text for the modules
    it names)."""
    names = _module_names()
    known = set(names)
    return {module: import_edges(module, (sources or {}).get(module) or path.read_text(),
                                 path.name == "__init__.py", known)
            for module, path in names.items()}


def test_no_import_cycle_counting_function_local_imports() -> None:
    cycle = find_cycle(import_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_sees_a_function_local_import_cycle() -> None:
    local = "def evaluate():\n    from metricsearch.evaluation.metrics import retrieval_metrics\n"
    cycle = find_cycle(import_graph({"metricsearch.evaluation.distances": local}))
    assert cycle[0] == cycle[-1] and "metricsearch.evaluation.distances" in cycle, cycle


#: old module path -> (its new path, a name both give)
RENAMED = {"metricsearch.index.layout": ("metricsearch.index.lmdb_store", "Store"),
           "metricsearch.index.steps": ("metricsearch.index.build_steps", "BUILD_STEPS"),
           "metricsearch.evaluation.text": ("metricsearch.evaluation.metrics_text", "format_metrics"),
           "metricsearch.models.batches": ("metricsearch.models.image_set_embedding", "embed_image_set")}


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_an_old_module_path_warns_and_gives_the_new_modules_objects(old: str, monkeypatch) -> None:
    new, name = RENAMED[old]
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=new):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)


def test_old_function_names_warn_and_give_the_new_functions() -> None:
    from metricsearch.evaluation import distances, metrics
    from metricsearch.index import faiss_index

    with pytest.warns(DeprecationWarning, match="index_from_factory"):
        assert faiss_index.build_index is faiss_index.index_from_factory
    with pytest.warns(DeprecationWarning, match="distances"):
        assert metrics.normalized is distances.normalized
    with pytest.raises(AttributeError):
        faiss_index.no_such_name


def _run_without_torch(code: str, cwd: Path) -> subprocess.CompletedProcess:
    prelude = "import sys\nsys.modules['torch'] = None\nsys.modules['torchvision'] = None\n"
    return subprocess.run([sys.executable, "-c", prelude + code], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_serving_modules_import_and_evaluate_without_torch(digits_onnx: Path, tmp_path: Path) -> None:
    code = f"""
import importlib, json
from metricsearch.data import load_split
gallery_image = load_split('digits').test.load(0)
for name in {TORCH_FREE!r}:
    importlib.import_module(name)
assert sys.modules.get('torch') is None
from metricsearch.app.cli import main
code = main(['evaluate', '--model', {str(digits_onnx)!r}, '--dataset', 'digits', '--json'])
assert code == 0, code
from metricsearch.index import Gallery
code = main(['index', 'build', '--model', {str(digits_onnx)!r}, '--images', 'digits', '--part', 'test',
             '--db', 'gallery', '--json'])
assert code == 0, code
with Gallery.open('gallery') as gallery:
    hits = gallery.search([gallery_image], k=3)[0]
assert hits[0].label == '5' and hits[0].score > 0.999, hits
assert main(['index', 'verify', '--db', 'gallery']) == 0
assert not any(m == 'metricsearch.train' or m.startswith('metricsearch.train.') for m in sys.modules)
"""
    done = _run_without_torch(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[0])
    assert set(result) == {"recall_at_k", "nmi", "map_at_r", "n_queries"}
    assert result["recall_at_k"]["1"] > 0.9


@pytest.mark.parametrize("command", [["train"], ["export", "runs/x", "--out", "m.onnx"]])
def test_training_commands_without_torch_name_the_extra(command: list[str], tmp_path: Path) -> None:
    done = _run_without_torch(f"from metricsearch.app.cli import main\nraise SystemExit(main({command!r}))", tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'metricsearch[train]'" in lines[0], done.stderr


def test_the_search_page_serves_without_torch(digits_gallery: Path, gallery_items, tmp_path: Path,
                                             free_port: int) -> None:
    item_id, _, image = gallery_items[0]
    image.save(tmp_path / "query.png")
    code = f"""
from gradio_client import Client, handle_file
from metricsearch.app.web import serve
server = serve({str(digits_gallery)!r}, port={free_port}, block=False, log=lambda _: None)
hits = Client(server.url, verbose=False, download_files=False).predict(
    handle_file('query.png'), 3, api_name='/search')[1]
server.close()
assert sys.modules.get('torch') is None
assert not any(m == 'metricsearch.train' or m.startswith('metricsearch.train.') for m in sys.modules)
print(hits[0]['id'])
"""
    done = _run_without_torch(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == str(item_id)
