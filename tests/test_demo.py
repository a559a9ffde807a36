"""`metricsearch demo`: the whole chain on digits into a work folder, then again, reusing it and serving."""

from __future__ import annotations

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
    assert main(["demo", "--no-serve", "--workdir", str(work)]) == 0
    out = capsys.readouterr().out
    for text in ("[1/5] train: digits", "[2/5] export", "[3/5] index", "[4/5] evaluate", "Recall@1", "MAP@R",
                 "sample searches: the first test image of each class"):
        assert text in out, out
    assert "reusing" not in out and "[5/5] serve" not in out
    for made in ("run/best.pt", "model.onnx", "gallery/report.json", "demo.json"):
        assert (work / made).exists(), made

    assert main(["demo", "--no-serve", "--workdir", str(work), "--dataset", "omniglot:elsewhere"]) == 2
    assert "holds the demo of 'digits'" in capsys.readouterr().err

    # the second run reuses every step, then serves the page (in a subprocess, stopped by the test)
    server = subprocess.Popen([sys.executable, "-u", "-m", "metricsearch", "demo", "--workdir", str(work),
                               "--port", str(free_port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd=tmp_path)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while not any("serving" in line for line in lines) and time.monotonic() < deadline:
            line = server.stdout.readline()
            if not line:
                break
            lines.append(line)
        out = "".join(lines)
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
