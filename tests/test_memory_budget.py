"""Batch jobs choose their batch so that their peak memory stays within `--memory` (issue 90, part 0): real
`metricsearch index build` and `evaluate` processes on a real ONNX model with wide activations, their peak
resident memory read from the kernel (ru_maxrss of the finished child)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from metricsearch.models import OnnxEmbedder
from metricsearch.models.memory_budget import (MAX_BATCH, SAFE_SHARE, batch_within, bytes_per_image, memory_gb,
                                               resident_bytes)

from onnx_models import wide_onnx

TIMEOUT = 600  # a bound for a hung job, never a measure of speed
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's ru_maxrss (KB) and /proc")
MB = 2**20


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The wide model, and a folder of 96 labelled 224 px photos-to-be (noise, 4 classes)."""
    root = tmp_path_factory.mktemp("wide")
    rng = np.random.default_rng(1)
    for n in range(96):
        folder = root / "images" / f"class{n % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)).save(folder / f"{n}.jpg")
    return wide_onnx(root / "wide.onnx"), root / "images"


def _peak_of_child(args: list[str]) -> tuple[subprocess.CompletedProcess, int]:
    """A `metricsearch` command run in a fresh interpreter, and its peak resident memory in bytes (the kernel's
    ru_maxrss of the only child that the wrapper waits for)."""
    wrapper = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True, "
               "text=True); sys.stdout.write(done.stdout); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
               "sys.stderr.write(done.stderr); sys.exit(done.returncode)")
    done = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "metricsearch", *args],
                          capture_output=True, text=True, timeout=TIMEOUT)
    return done, int(done.stdout.split()[-1]) * 1024 if done.stdout.strip() else 0


@pytest.mark.parametrize("command", ["index build", "evaluate"])
def test_a_batch_job_stays_within_its_memory_budget_where_a_fixed_batch_does_not(wide, tmp_path: Path,
                                                                                 command: str) -> None:
    model, images = wide
    if command == "index build":
        job, batch = ["index", "build", "--images", f"folder:{images}", "--no-thumbnails"], "--batch"
    else:
        job, batch = ["evaluate", "--query", f"folder:{images}", "--gallery", f"folder:{images}", "--no-nmi"], \
            "--batch-size"

    def args(db: str, *extra: str) -> list[str]:
        where = ["--db", str(tmp_path / db)] if command == "index build" else []
        return [*job, *where, "--model", str(model), "--json", *extra]

    budgeted, budgeted_peak = _peak_of_child(args("budgeted", "--memory", "0.6"))
    fixed, fixed_peak = _peak_of_child(args("fixed", batch, "64"))
    assert budgeted.returncode == 0 and fixed.returncode == 0, (budgeted.stderr[-2000:], fixed.stderr[-2000:])
    print(f"\n{command}: --memory 0.6 peak {budgeted_peak / MB:.0f} MB; --batch 64 peak {fixed_peak / MB:.0f} MB")
    assert budgeted_peak <= 0.6 * 2**30 < fixed_peak, (budgeted_peak, fixed_peak)
    if command == "index build":  # the same gallery, whatever the batch
        assert json.loads(budgeted.stdout.splitlines()[0])["count"] == json.loads(fixed.stdout.splitlines()[0])[
            "count"] == 96


def test_the_batch_follows_the_budget_and_the_model(wide, digits_onnx: Path) -> None:
    wide_model = OnnxEmbedder(wide[0], arena=False)
    per_image = bytes_per_image(wide_model.embed_arrays, (3, 224, 224))
    assert 8 * MB < per_image < 64 * MB, per_image  # 12.8 MB of maps an image, and their ReLU

    def budget(free_gb: float) -> int:  # a budget that leaves this much beside what the test process holds
        return int((resident_bytes() + free_gb * 2**30) / SAFE_SHARE)

    batches = [wide_model.batch_within(budget(gb)) for gb in (0.1, 0.2, 0.4, 0.8)]
    assert batches == sorted(batches) and 1 <= batches[0] < batches[-1], batches
    assert batch_within(1, wide_model.embed_arrays, (3, 224, 224)) == 1  # nothing left: one image at a time
    digits = OnnxEmbedder(digits_onnx, arena=False)
    assert digits.batch_within(budget(0.2)) == MAX_BATCH > batches[1]  # a small model takes the largest


def test_bytes_per_image_is_measured_alike_after_a_process_freed_a_large_batch(wide) -> None:
    """A process that ran a large batch keeps its freed heap pages resident; a probe that reused them unseen
    measured 0.6 MB an image instead of 12 (and chose the largest batch in CI, in a worker that ran other tests)."""
    model = OnnxEmbedder(wide[0], arena=False)
    fresh = bytes_per_image(model.embed_arrays, (3, 224, 224))
    model.embed_arrays(np.zeros((32, 3, 224, 224), np.float32))
    blocks = [np.ones(25_000) for _ in range(3000)]
    live = [block[:10].copy() for block in blocks[::50]]  # small live blocks between freed ones: the heap keeps
    del blocks  # its pages
    after = bytes_per_image(model.embed_arrays, (3, 224, 224))
    assert 0.8 * fresh < after < 1.25 * fresh and live, (fresh, after)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "two", "1e9"])
def test_a_bad_memory_value_exits_2_in_one_line(value: str, digits_onnx: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--memory must be a number of GB between 0.05 and 1024"):
        memory_gb(value)
    done = subprocess.run([sys.executable, "-m", "metricsearch", "index", "build", "--db", str(tmp_path / "g"),
                           "--model", str(digits_onnx), "--images", "digits", "--memory", value],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--memory" in done.stderr, done.stderr
    assert not (tmp_path / "g").exists()

