"""A real `index build` subprocess SIGKILLed at every named step of a build, and commands that must
fail before they leave anything on disk: after each, the gallery recovers to the clean build's items, and an
interrupted build is finished by --resume only (`index rebuild` refuses to mark it ready)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from index_data import cli, job_state, one_line, write_flat_folder

from metricsearch.app.cli import main
from metricsearch.index import Gallery, build_gallery, verify_gallery
from metricsearch.index.build_steps import BUILD_STEPS

KILLER = Path(__file__).with_name("workers") / "kill_at_step.py"


def build_args(model: Path, images: str, db: Path, *extra: str) -> list[str]:
    return ["index", "build", "--model", str(model), "--images", images, "--db", str(db), "--batch", "8",
            "--workers", "1", "--json", *extra]


def killed_at(step: str, args: list[str]) -> subprocess.CompletedProcess:
    """`metricsearch ARGS` run in a process that SIGKILLs itself when the build reaches `step` (STEP or STEP:N)."""
    return subprocess.run([sys.executable, str(KILLER), step, *args], capture_output=True, text=True, timeout=300)


def test_a_build_killed_at_every_step_recovers_to_exactly_the_clean_gallery(digits_onnx, tmp_path) -> None:
    images = write_flat_folder(tmp_path / "imgs", 36)  # 5 batches of 8
    build_gallery(digits_onnx, f"files:{images}", tmp_path / "clean", batch_size=8)
    with Gallery.open(tmp_path / "clean") as clean:
        expected = sorted(clean.catalog.paths)
    assert len(expected) == 36
    first_commit = BUILD_STEPS.index("created")
    for i, step in enumerate(BUILD_STEPS):
        db = tmp_path / step
        args = build_args(digits_onnx, f"files:{images}", db)
        killed = killed_at(step, args)
        assert killed.returncode == -signal.SIGKILL, (step, killed.returncode, killed.stderr[-2000:])
        # nothing committed yet: the same command runs again; else --resume continues
        again = cli(*args, *(["--resume"] if i >= first_commit else []))
        assert again.returncode == 0, (step, again.stderr[-2000:])
        check = verify_gallery(db)
        assert check["ok"] and check["count"] == 36, (step, check)
        assert job_state(db)["state"] == "ready"
        assert sorted(p.suffix for p in (db / "index").iterdir()) == [".faiss", ".json"], step  # nothing left over
        with Gallery.open(db) as gallery:
            assert sorted(gallery.catalog.paths) == expected, step
            assert gallery.catalog.ids.tolist() == list(range(36)), step  # nothing stored twice
    killed = killed_at("batch:3", build_args(digits_onnx, f"files:{images}", tmp_path / "third"))
    assert killed.returncode == -signal.SIGKILL
    assert job_state(tmp_path / "third")["count"] == 24  # three batches of 8 were committed


def test_rebuild_refuses_an_interrupted_build_that_verify_calls_unfinished_and_resume_ends(digits_onnx, tmp_path,
                                                                                          capsys) -> None:
    images = write_flat_folder(tmp_path / "imgs", 40)
    db = tmp_path / "g"
    args = build_args(digits_onnx, f"files:{images}", db)
    assert killed_at("batch:2", args).returncode == -signal.SIGKILL
    assert job_state(db)["count"] == 16
    assert main(["index", "rebuild", "--db", str(db)]) == 2  # not marked ready with 16 of its 40 images
    err = one_line(capsys.readouterr().err)
    assert "did not finish (16 images stored" in err and "--resume" in err, err
    assert job_state(db)["state"] == "building"
    assert main(["index", "verify", "--db", str(db)]) == 1
    assert "the build did not finish" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0
    check = verify_gallery(db)
    assert check["ok"] and check["count"] == 40, check


@pytest.mark.parametrize("images", ["files:/no/such/dir", "no_scheme_folder", "filez:{images}"])
def test_a_bad_images_spec_is_refused_before_the_gallery_folder_is_made(digits_onnx, tmp_path, capsys,
                                                                       images) -> None:
    folder = write_flat_folder(tmp_path / "imgs", 12)
    db = tmp_path / "g"
    assert main(build_args(digits_onnx, images.format(images=folder), db)) == 2
    one_line(capsys.readouterr().err)
    assert not db.exists()  # no half gallery, no write.lock
    assert main(build_args(digits_onnx, f"files:{folder}", db)) == 0
    assert verify_gallery(db)["ok"]


def test_a_missing_or_garbage_model_is_refused_before_the_gallery_folder_is_made(digits_onnx, tmp_path,
                                                                                capsys) -> None:
    folder = write_flat_folder(tmp_path / "imgs", 12)
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(os.urandom(4096))
    db = tmp_path / "g"
    for model in (tmp_path / "missing.onnx", garbage):
        assert main(build_args(model, f"files:{folder}", db)) == 2
        assert str(model) in one_line(capsys.readouterr().err)
        assert not db.exists()
    assert main(build_args(digits_onnx, f"files:{folder}", db)) == 0


def test_an_untrainable_index_is_refused_before_embedding_or_resumed_with_another(digits_onnx, tmp_path,
                                                                                 capsys) -> None:
    folder = write_flat_folder(tmp_path / "imgs", 40)
    db = tmp_path / "g"
    assert main(build_args(digits_onnx, f"files:{folder}", db, "--index", "IVF99999,Flat")) == 2
    assert "99999 lists" in one_line(capsys.readouterr().err)
    assert not db.exists()
    # 40 files but only 10 images: the index cannot be trained once the images are in
    for path in sorted(folder.glob("*.png"))[10:]:
        path.write_text("not an image")
    assert main(build_args(digits_onnx, f"files:{folder}", db, "--index", "IVF20,Flat")) == 2
    err = one_line(capsys.readouterr().err)
    assert "IVF20,Flat" in err and "--index" in err, err
    assert job_state(db)["state"] == "building" and job_state(db)["count"] == 10
    assert main(build_args(digits_onnx, f"files:{folder}", db, "--resume", "--index", "flat")) == 0
    capsys.readouterr()
    check = verify_gallery(db)
    assert check["ok"] and check["count"] == 10, check


@pytest.mark.parametrize("option", [["--max-pixels", "0"], ["--max-pixels", "-1"], ["--min-side", "-1"],
                                    ["--min-side", "0"], ["--thumbnail-size", "-5"], ["--batch", "0"],
                                    ["--workers", "0"], ["--ray-actors", "0"]])
def test_a_non_positive_number_is_refused_in_one_line_before_anything_is_made(digits_onnx, tmp_path, capsys,
                                                                              option) -> None:
    folder = write_flat_folder(tmp_path / "imgs", 4)
    db = tmp_path / "g"
    assert main([*build_args(digits_onnx, f"files:{folder}", db), *option]) == 2
    err = one_line(capsys.readouterr().err)
    assert option[0] in err and option[1] in err, err
    assert not db.exists()
    if option[0] in ("--batch", "--workers"):
        build_gallery(digits_onnx, f"files:{folder}", db)
        assert main(["index", "add", "--db", str(db), "--images", f"files:{folder}", *option]) == 2
        assert option[0] in one_line(capsys.readouterr().err)
