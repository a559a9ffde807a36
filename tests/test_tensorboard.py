"""`logging.tensorboard: true`: a short real training run writes event files whose scalars are metrics.jsonl's,
plus the similarity histograms and the pair-weight picture at each evaluation (read back with TensorBoard's own
EventAccumulator)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from metricsearch.train.tensorboard_log import scalars  # noqa: E402
from metricsearch.train.config import load_config  # noqa: E402
from metricsearch.train.trainer import train  # noqa: E402

pytestmark = pytest.mark.timeout(900)


def _events(run_dir: Path) -> EventAccumulator:
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0, "images": 0})
    return events.Reload()


def test_event_files_hold_the_scalars_of_metrics_jsonl_and_the_evaluation_pictures(tmp_path: Path) -> None:
    config = load_config(None, [f"output_dir={tmp_path}", "epochs=3", "batches_per_epoch=4", "eval.every=2",
                                "logging.tensorboard=true", "val_classes=0.4", "sampler.classes_per_batch=3"])
    run = train(config, progress=False)
    *rows, test = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all("lr" in row and "images_per_s" in row for row in rows) and test["split"] == "test"
    events = _events(run.run_dir)
    expected: dict[str, list[tuple[int, float]]] = {}
    for row, prefix in [*((row, "") for row in rows), (test, "test/")]:  # the test classes' record under test/
        for tag, value in scalars(row, prefix):
            expected.setdefault(tag, []).append((row["epoch"], value))
    assert {"loss", "lr", "images_per_s", "recall_at_k/1", "map_at_r", "nmi", "test/recall_at_k/1"} <= set(expected)
    assert set(events.Tags()["scalars"]) == set(expected)
    for tag, points in expected.items():
        got = [(e.step, e.value) for e in events.Scalars(tag)]
        assert [step for step, _ in got] == [step for step, _ in points], tag
        assert all(abs(a - b) <= 1e-6 * max(1.0, abs(b)) for (_, a), (_, b) in zip(got, points)), (tag, got, points)
    assert [step for step, _ in expected["recall_at_k/1"]] == [2, 3]  # validated at epoch 2 and the last
    for tag in ("similarity/positive", "similarity/negative"):
        histograms = events.Histograms(tag)
        assert [h.step for h in histograms] == [2, 3] and all(h.histogram_value.num > 0 for h in histograms)
    pictures = events.Images("pair_weights")
    assert [p.step for p in pictures] == [2, 3]
    assert Image.open(io.BytesIO(pictures[-1].encoded_image_string)).size == Image.open(
        run.run_dir / "pair_weights.png").size


def test_resuming_adds_only_the_new_epochs_and_off_writes_nothing(tmp_path: Path) -> None:
    overrides = [f"output_dir={tmp_path}", "epochs=2", "batches_per_epoch=3", "logging.tensorboard=true"]
    train(load_config(None, overrides), progress=False, stop_after_epoch=1)
    run = train(load_config(None, overrides), resume=True, progress=False)
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()][:-1]  # epochs
    got = [(e.step, e.value) for e in _events(run.run_dir).Scalars("loss")]
    assert got == [(row["epoch"], pytest.approx(row["loss"])) for row in rows]
    off = train(load_config(None, [f"output_dir={tmp_path}", "name=no-board", "epochs=1", "batches_per_epoch=2"]),
                progress=False)
    assert not (off.run_dir / "tensorboard").exists()
    with pytest.raises(ValueError, match=r"logging\.tensorboard"):
        train(load_config(None, [f"output_dir={tmp_path}", "name=bad", "logging.tensorboard=maybe"]), progress=False)
