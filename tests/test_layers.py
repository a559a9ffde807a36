"""The serving side runs without torch or train/: imports flow app -> index -> (train) -> models -> data, evaluation."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: modules that must never import torch or metricsearch.train (directly or through their imports)
TORCH_FREE = ["metricsearch.data", "metricsearch.evaluation", "metricsearch.models",
              "metricsearch.models.onnx_embedder", "metricsearch.models.batches", "metricsearch.index",
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
