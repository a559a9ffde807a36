"""Indexing under bad input, SIGKILL and concurrent readers, on real files, LMDB and faiss; and an
approximate index on real Omniglot drawings."""

from __future__ import annotations

import io
import json
import threading
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
from index_data import cli, cli_popen, killed_at_batch, report, write_flat_folder
from PIL import Image

from metricsearch.index import Gallery, add_images, build_gallery, edit_gallery, evaluate_gallery, verify_gallery
from metricsearch.index.lmdb_store import ADD, Store


def noise_photo(seed: int, size: tuple[int, int] = (64, 48)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))


def write_hostile(root: Path) -> dict[str, str]:
    """Every kind of bad or unusual file the indexer must survive; name -> expected outcome."""
    root.mkdir()
    noise_photo(1).save(root / "ok.jpg")
    (root / "ok_copy.jpg").write_bytes((root / "ok.jpg").read_bytes())  # comes second: the duplicate
    for name, fmt, seed in (("truncated.jpg", "JPEG", 2), ("truncated.png", "PNG", 3)):
        buf = io.BytesIO()
        noise_photo(seed).save(buf, fmt)
        (root / name).write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    (root / "text.png").write_text("this is not an image\n" * 10)
    (root / "empty.jpg").write_bytes(b"")
    Image.new("RGB", (1, 1), (10, 20, 30)).save(root / "one_pixel.png")
    noise_photo(4).convert("CMYK").save(root / "cmyk.jpg")
    Image.fromarray((np.arange(48 * 64).reshape(48, 64) * 21).astype(np.uint16)).save(root / "sixteen_bit.png")
    arr = np.zeros((40, 40), np.uint8)
    arr[10:30, 10:30] = 1
    palette = Image.fromarray(arr, "P")
    palette.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    palette.save(root / "palette_transparent.png", transparency=0)
    frames = [noise_photo(s).convert("P") for s in (5, 6, 7)]
    frames[0].save(root / "animated.gif", save_all=True, append_images=frames[1:], duration=100, loop=0)
    frames[0].save(root / "first_frame.png")
    pages = [noise_photo(8), noise_photo(9, (30, 50)).convert("L")]  # a multi-page TIFF: indexed as its first page
    pages[0].save(root / "pages.tif", save_all=True, append_images=pages[1:])
    pages[0].save(root / "first_page.png")
    Image.new("L", (3000, 3000), 0).save(root / "bomb.png")  # 9 Mpx in a few kB
    return {"ok.jpg": "indexed", "ok_copy.jpg": "duplicate", "cmyk.jpg": "indexed", "sixteen_bit.png": "indexed",
            "palette_transparent.png": "indexed", "animated.gif": "indexed", "first_frame.png": "indexed",
            "pages.tif": "indexed", "first_page.png": "indexed",
            "truncated.jpg": "truncated", "truncated.png": "truncated", "text.png": "not an image",
            "empty.jpg": "empty file", "one_pixel.png": "smaller than 8 px", "bomb.png": "over the limit of 4000000"}


def test_hostile_files_are_skipped_and_reported_the_rest_indexed(digits_onnx, tmp_path) -> None:
    expected = write_hostile(tmp_path / "in")
    summary = build_gallery(digits_onnx, f"files:{tmp_path / 'in'}", tmp_path / "g", max_pixels=4_000_000)
    failures = {Path(f["path"]).name: f["reason"] for f in report(tmp_path / "g")["failures"]}
    bad = {k: v for k, v in expected.items() if v not in ("indexed", "duplicate")}
    assert set(failures) == set(bad)
    for name, reason in bad.items():
        assert reason in failures[name], (name, failures[name])
    assert (summary.indexed, summary.duplicates, summary.failed) == (8, 1, 6)
    with Gallery.open(tmp_path / "g") as gallery:
        names = {Path(p).name for p in gallery.catalog.paths}
        assert names == {k for k, v in expected.items() if v == "indexed"}
        hits = gallery.search([str(tmp_path / "in" / "first_frame.png")], k=2)[0]
        assert {Path(h.path).name for h in hits} == {"first_frame.png", "animated.gif"}
        assert min(h.score for h in hits) > 0.9999  # the GIF is indexed as its first frame
        assert Image.open(tmp_path / "in" / "pages.tif").n_frames == 2
        hits = gallery.search([str(tmp_path / "in" / "pages.tif")], k=2)[0]  # a query too: its first page
        assert {Path(h.path).name for h in hits} == {"first_page.png", "pages.tif"}
        assert min(h.score for h in hits) > 0.9999
        for item_id in gallery.catalog.ids:
            assert max(Image.open(io.BytesIO(gallery.thumbnail(int(item_id)))).size) <= 256
    assert verify_gallery(tmp_path / "g")["ok"]


def test_build_resumes_after_sigkill_without_losing_or_repeating_an_image(digits_onnx, tmp_path) -> None:
    images = write_flat_folder(tmp_path / "imgs", 1200)
    db = tmp_path / "g"
    args = ["index", "build", "--model", str(digits_onnx), "--images", f"files:{images}", "--db", str(db),
            "--batch", "8", "--workers", "1", "--json"]
    for i, (batch, indexed) in enumerate(((10, 80), (40, 400))):  # batches of 8: killed at 80, then 80 + 320
        state = killed_at_batch(db, [*args, *(["--resume"] if i else [])], batch)
        assert state["state"] == "building" and state["job"]["indexed"] == indexed, state
        assert state["count"] == state["job"]["indexed"]
    refused = cli(*args)
    assert refused.returncode == 2 and "already holds a gallery" in refused.stderr
    assert not verify_gallery(db)["ok"]
    done = cli(*args, "--resume")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["indexed"], summary["duplicates"], summary["failed"], summary["count"]) == (1200, 0, 0, 1200)
    assert summary["resumed"] == 2
    assert verify_gallery(db) == {**verify_gallery(db), "ok": True, "notes": []}
    with Gallery.open(db) as gallery:
        assert sorted(gallery.catalog.paths) == sorted(str(p) for p in images.glob("*.png"))
        assert gallery.catalog.ids.tolist() == list(range(1200))


def test_an_add_killed_midway_leaves_a_consistent_gallery_and_runs_again(digits_onnx, tmp_path) -> None:
    first, second = write_flat_folder(tmp_path / "a", 100), write_flat_folder(tmp_path / "b", 700)
    for i, path in enumerate(sorted(second.glob("*.png"))):  # other pixels than folder a
        Image.fromarray(255 - np.asarray(Image.open(path)), "L").save(path)
    db = tmp_path / "g"
    build_gallery(digits_onnx, f"files:{first}", db)
    state = killed_at_batch(db, ["index", "add", "--db", str(db), "--images", f"files:{second}", "--batch", "8",
                                 "--workers", "1"], 8)
    committed = state["job"]["indexed"]
    assert state["job"]["command"] == "add" and committed == 64
    check = verify_gallery(db)
    assert check["ok"] and check["count"] == 100 + committed, check
    assert "behind the LMDB" in " ".join(check["notes"])
    with Gallery.open(db) as gallery:
        assert len(gallery) == 100 + committed
    summary = add_images(db, f"files:{second}")
    assert (summary.indexed, summary.duplicates, summary.count) == (700 - committed, committed, 800)
    assert verify_gallery(db) == {**verify_gallery(db), "ok": True, "notes": []}


def committed_version(db) -> int:
    """The gallery's count of committed writes."""
    with Store.opened(db) as store, store.read() as txn:
        return store.version(txn)


def batches_of_add(db, after: int) -> list[np.ndarray]:
    """The id batches committed by writes after version `after`, from the change log."""
    with Store.opened(db) as store, store.read() as txn:
        changes = store.log_since(txn, after, store.version(txn))
    return [ids for op, ids in changes if op == ADD]


def search_while(gallery: Gallery, busy, base: set[int]) -> tuple[list[frozenset], list[BaseException]]:
    """8 threads searching the whole gallery until busy() is false: the new ids each search saw."""
    seen: list[frozenset] = []
    errors: list[BaseException] = []
    query = np.ones((1, gallery.dim), np.float32)

    def loop() -> None:
        try:
            while busy():
                seen.append(frozenset(int(i) for i in gallery.search(query, k=4000)[0].ids) - base)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=loop) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return seen, errors


def assert_whole_batches(seen: list[frozenset], batches: list[np.ndarray]) -> None:
    prefixes = {frozenset(np.concatenate(batches[:n]).tolist()) if n else frozenset() for n in range(len(batches) + 1)}
    halves = [s for s in seen if s not in prefixes]
    assert not halves, f"{len(halves)} search(es) saw part of a batch, e.g. {sorted(halves[0])[:20]}"


@pytest.mark.parametrize("where", ["other process", "same process"])
def test_eight_threads_search_while_images_are_added(where, digits_onnx, tmp_path) -> None:
    db = tmp_path / "g"
    build_gallery(digits_onnx, "digits", db, part="test")
    with ExitStack() as stack:
        if where == "same process":  # the writer's own gallery searches while it adds
            editor = stack.enter_context(edit_gallery(db))
            gallery = editor.gallery
        else:
            gallery = stack.enter_context(Gallery.open(db))
        base, start = set(gallery.catalog.ids.tolist()), committed_version(db)
        if where == "other process":
            proc = cli_popen("index", "add", "--db", str(db), "--images", "digits", "--split", "train", "--batch", "16")
            seen, errors = search_while(gallery, lambda: proc.poll() is None, base)
            assert proc.returncode == 0, proc.stderr.read()
        else:
            adder = threading.Thread(target=editor.add, args=("digits",), kwargs={"part": "train", "batch_size": 16})
            adder.start()
            seen, errors = search_while(gallery, adder.is_alive, base)
            adder.join()
        assert not errors, errors[:3]
        gallery.refresh()
        batches = batches_of_add(db, start)
        assert sum(map(len, batches)) == 901 and len(gallery) == 896 + 901
        assert len(seen) > 8
        assert_whole_batches(seen, batches)
    assert verify_gallery(db)["ok"]


def test_ivf_gallery_of_omniglot_drawings(digits_onnx, omniglot_dir, tmp_path, capsys) -> None:
    from metricsearch.app.cli import main

    db = tmp_path / "omni"
    summary = build_gallery(digits_onnx, f"omniglot:{omniglot_dir}", db, part="test", index="ivf")
    assert summary.indexed + summary.duplicates == 2240 and summary.failed == 0
    assert summary.index["kind"] == "ivf" and summary.index["tuning"]["recall_at_10"] >= 0.95
    with Gallery.open(db) as gallery:
        ids, vectors = gallery.vectors()
        hits = gallery.search(vectors[::50], k=1)
        assert [int(h[0].id) for h in hits] == ids[::50].tolist()
        assert gallery.info()["search_params"]["nprobe"] >= 1
    assert main(["evaluate", "--db", str(db), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["recall_at_10_vs_exact"] >= 0.9 and result["n_queries"] == summary.count
    assert result["recall_at_k"]["1"] > 0.3  # a digits model on drawings: well above chance (1/112)
    assert verify_gallery(db)["ok"]
    assert evaluate_gallery(db, with_nmi=False)["nmi"] is None
