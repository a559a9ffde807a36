"""`metricsearch demo`: the whole chain into a work folder, then again, reusing it and serving; the embedded
default (Omniglot) beats raw pixels on every metric it prints."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gradio_client import Client, handle_file
from PIL import Image

from metricsearch.app.cli import main


@pytest.mark.slow
def test_demo_builds_everything_then_reuses_it_and_serves(tmp_path: Path, capsys, free_port: int) -> None:
    work = tmp_path / "demo"
    assert main(["demo", "--no-serve", "--workdir", str(work), "--dataset", "digits"]) == 0
    out = capsys.readouterr().out
    for text in ("[1/5] train: digits", "[2/5] export", "[3/5] index", "[4/5] evaluate", "Recall@1", "MAP@R",
                 "sample searches: the first test image of each test class"):
        assert text in out, out
    assert "reusing" not in out and "[5/5] serve" not in out
    for made in ("run/best.pt", "model.onnx", "gallery/report.json", "demo.json"):
        assert (work / made).exists(), made

    assert main(["demo", "--no-serve", "--workdir", str(work), "--dataset", "omniglot:elsewhere"]) == 2
    assert "holds the demo of 'digits'" in capsys.readouterr().err

    # the second run reuses every step, then serves the page (in a subprocess, stopped by the test)
    server = subprocess.Popen([sys.executable, "-u", "-m", "metricsearch", "demo", "--workdir", str(work),
                               "--dataset", "digits", "--port", str(free_port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        out = _until_serving(server)
        assert f"http://127.0.0.1:{free_port}/" in out, out
        for step in ("train", "export", "index", "evaluate"):
            assert f"{step}: reusing" in out, out
        client = Client(f"http://127.0.0.1:{free_port}/", verbose=False, download_files=False)
        query, label = _first_test_digit(tmp_path)
        broken = tmp_path / "broken.jpg"  # a JPEG cut short, as an interrupted upload leaves it
        Image.open(query).convert("RGB").resize((256, 256)).save(broken, quality=95)
        data = broken.read_bytes()
        broken.write_bytes(data[:len(data) // 2])
        with pytest.raises(Exception, match="broken.jpg: not a readable image"):
            client.predict(handle_file(str(broken)), api_name="/search")
        thumbs = client.predict(handle_file(str(query)), 3, api_name="/search")[0]
        assert len(thumbs) == 3 and thumbs[0]["caption"].startswith(f"{label} ·"), thumbs
    finally:
        server.terminate()
        server.wait(30)


def _first_test_digit(folder: Path) -> tuple[Path, str]:
    from metricsearch.data import load_split

    test = load_split("digits").test
    path = folder / "digit.png"
    test.load(0).resize((32, 32)).save(path)
    return path, test.class_names[test.labels[0]]


def _until_serving(server: subprocess.Popen) -> str:
    """What a serving subprocess printed up to its `serving ...` line (or its end)."""
    lines: list[str] = []
    deadline = time.monotonic() + 240
    while not any("serving" in line for line in lines) and time.monotonic() < deadline:
        line = server.stdout.readline()
        if not line:
            break
        lines.append(line)
    return "".join(lines)


def test_omniglot_without_a_path_is_the_embedded_copy_with_alphabets_held_out() -> None:
    import metricsearch
    from metricsearch.data import load_split

    split = load_split("omniglot")
    assert Path(split.spec.partition(":")[2]).is_relative_to(Path(metricsearch.__file__).parent / "data"), split.spec
    train, test = set(split.train.groups.tolist()), set(split.test.groups.tolist())
    assert train and test and not train & test, (train, test)
    assert (Path(metricsearch.__file__).parent / "data" / "omniglot_small" / "LICENSE").read_text().count(
        "Brenden Lake")


@pytest.mark.slow
def test_default_demo_beats_raw_pixels_on_every_printed_metric(tmp_path: Path, capsys, free_port: int) -> None:
    work = tmp_path / "demo"
    assert main(["demo", "--no-serve", "--workdir", str(work)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "[1/5] train: omniglot" in out and "Constant folding" not in captured.err, captured
    assert re.search(r"best\.pt: epoch 3 of 3, the last epoch.*on the test classes, scored once", out), out
    assert "sample searches: the first test image of the first 8 of the " in out, out

    table = out[out.index("evaluation on the "):out.index("sample searches")]
    rows = re.findall(r"^  (\S.*?)\s+(\d\.\d{4})\s+(\d\.\d{4})$", table, flags=re.M)
    names = [name for name, _, _ in rows]
    assert len(rows) == len(table.strip().splitlines()) - 2, table  # every printed metric is parsed
    assert {"Recall@1", "NMI", "MAP@R"} <= set(names) and any("one-shot error" in n for n in names), table
    for name, trained, pixels in rows:
        better = float(trained) < float(pixels) if "error" in name else float(trained) > float(pixels)
        assert better, f"{name}: trained {trained}, pixels {pixels}"
    state = json.loads((work / "demo.json").read_text())["steps"]
    assert (state["index"]["count"] == state["evaluate"]["trained"]["n_queries"]
            == state["evaluate"]["pixels"]["n_queries"])

    # the printout ends with the command that serves this gallery: run it
    command = out.strip().splitlines()[-1].strip()
    assert command == f"metricsearch serve --db {shlex.quote(str(work / 'gallery'))}", out
    server = subprocess.Popen([sys.executable, "-u", "-m", *shlex.split(command), "--port", str(free_port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        served = _until_serving(server)
        assert f"serving {state['index']['count']} images from {work / 'gallery'} on http://127.0.0.1:{free_port}/" \
            in served, served
    finally:
        server.terminate()
        server.wait(30)
