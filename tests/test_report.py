"""`metricsearch evaluate --report DIR` in every mode: real models (the session's trained digits ONNX,
raw pixels, a short Omniglot training), real galleries; the files decode and the page stands alone."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from PIL import Image

from metricsearch.app.cli import main

from conftest import REPO
from index_data import unique_digits, write_class_folder

PNGS = ("worst.png", "classes.png", "map.png")


def check_report(out: Path) -> list[dict]:
    """Assert that the report's PNGs decode and its page names only files beside it; its class rows."""
    for name in PNGS:
        with Image.open(out / name) as image:
            image.load()
            assert image.width > 100 and image.height > 100, name
    page = (out / "report.html").read_text()
    assert "<script" not in page.lower() and "@import" not in page and "url(" not in page
    links = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert sorted(set(links)) == sorted({"worst.png", "classes.png", "map.png", "classes.csv", "confusions.csv"})
    assert all((out / link).is_file() for link in links)
    with open(out / "classes.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    recalls = [float(r["recall_at_1"]) for r in rows]
    assert recalls == sorted(recalls) and all(0.0 <= r <= 1.0 for r in recalls)
    return rows


def test_report_of_a_data_set_a_query_gallery_pair_and_a_gallery(digits_onnx: Path, digits_gallery: Path,
                                                                  tmp_path: Path, capsys) -> None:
    assert main(["evaluate", "--model", str(digits_onnx), "--dataset", "digits", "--no-nmi", "--json",
                 "--report", str(tmp_path / "model")]) == 0
    assert {r["label"] for r in check_report(tmp_path / "model")} == {"5", "6", "7", "8", "9"}

    digits = unique_digits("test")
    query, gallery = write_class_folder(tmp_path / "q", digits[0::4]), write_class_folder(tmp_path / "g", digits[1::4])
    assert main(["evaluate", "--model", "pixels", "--query", f"folder:{query}", "--gallery", f"folder:{gallery}",
                 "--no-nmi", "--json", "--report", str(tmp_path / "pair")]) == 0
    assert sum(int(r["queries"]) for r in check_report(tmp_path / "pair")) == len(digits[0::4])

    assert main(["evaluate", "--db", str(digits_gallery), "--no-nmi", "--report", str(tmp_path / "db")]) == 0
    rows = check_report(tmp_path / "db")
    assert "report: " in capsys.readouterr().err
    # every labelled item of the gallery queried the rest
    from metricsearch.index import Gallery

    with Gallery.open(digits_gallery) as g:
        assert sum(int(r["queries"]) for r in rows) == len(g)


def test_missing_report_extra_is_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = ("import sys; sys.modules['sklearn'] = None\nfrom metricsearch.app.cli import main\n"
            f"sys.exit(main(['evaluate', '--model', 'pixels', '--dataset', 'digits', '--no-nmi', '--report', "
            f"{str(tmp_path / 'r')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("pip install 'metricsearch[report]'")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.fixture(scope="module")
def omniglot_onnx(omniglot_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """configs/omniglot.yaml trained briefly (one short epoch, no distillation, held-out alphabets) in ONNX."""
    from metricsearch.train import export_onnx, load_config, train

    out = tmp_path_factory.mktemp("omniglot")
    config = load_config(REPO / "configs" / "omniglot.yaml", [
        f"output_dir={out}", f"dataset=omniglot:{omniglot_dir}", "split=test", "epochs=1", "batches_per_epoch=60",
        "distill.epochs=0", "eval.every=100", "eval.nmi=false", "eval.one_shot_ways=null", "model.tta_shifts=[]",
        "model.tta_symmetries=[]", "augment_classes=[]"])
    run = train(config, progress=False)
    return export_onnx(run.run_dir, out / "omniglot.onnx").path


@pytest.mark.slow
def test_raw_pixels_on_omniglot_list_worse_classes_than_a_trained_model(omniglot_dir: Path, omniglot_onnx: Path,
                                                                          tmp_path: Path) -> None:
    spec = f"omniglot:{omniglot_dir}"
    for name, model in (("pixels", "pixels"), ("trained", str(omniglot_onnx))):
        assert main(["evaluate", "--model", model, "--dataset", spec, "--no-nmi", "--json",
                     "--report", str(tmp_path / name)]) == 0
    pixels, trained = check_report(tmp_path / "pixels"), check_report(tmp_path / "trained")
    assert {r["label"] for r in pixels} == {r["label"] for r in trained}

    def worst(rows: list[dict], n: int = 20) -> float:
        return sum(float(r["recall_at_1"]) for r in rows[:n]) / n

    def mean(rows: list[dict], key: str) -> float:
        return sum(float(r[key]) for r in rows) / len(rows)

    assert worst(pixels) < worst(trained)
    assert mean(pixels, "recall_at_1") < mean(trained, "recall_at_1")
    assert mean(pixels, "map_at_r") < mean(trained, "map_at_r")
