"""The ray indexing engine on a local 2-CPU Ray cluster (one per module): the same gallery as the local
engine (ids, labels, embeddings, duplicates, failures, search results), and resume after SIGKILL."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from index_data import cli, job_state, killed_at_batch, report, unique_digits, write_class_folder, write_flat_folder

from metricsearch.index import Gallery, build_gallery, verify_gallery
from metricsearch.index.layout import Store
from metricsearch.index.ray_engine import cluster_actors

ray = pytest.importorskip("ray", reason="the ray engine needs Ray Data: pip install 'metricsearch[scale]'")


@pytest.fixture(scope="module")
def cluster() -> str:
    """A local Ray cluster of 2 CPUs, shared by the module; its address."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def digit_folder(tmp_path_factory) -> Path:
    """folder: of the held-out digits 5-9 (20 per class), one exact duplicate and one file that is no image."""
    root = write_class_folder(tmp_path_factory.mktemp("digits"), unique_digits("test", per_class=20))
    shutil.copyfile(root / "5" / "00000.png", root / "5" / "zz_copy.png")
    (root / "6" / "zz_text.png").write_text("not an image\n")
    return root


def stored(db: Path) -> tuple[np.ndarray, list, list, np.ndarray]:
    """ids, labels, paths and embeddings of a gallery, in id order."""
    with Gallery.open(db) as gallery:
        catalog = gallery.catalog
        ids, paths = catalog.ids.copy(), list(catalog.paths)
        labels = [catalog.label_of(row) for row in range(len(ids))]
    store = Store.open(db)
    try:
        with store.read() as txn:
            vector_ids, vectors = store.vectors(txn)
    finally:
        store.close()
    order = np.argsort(vector_ids)
    assert vector_ids[order].tolist() == ids.tolist()
    return ids, labels, paths, vectors[order]


def test_ray_build_equals_the_local_build(cluster, digits_onnx, digit_folder, tmp_path) -> None:
    spec = f"folder:{digit_folder}"
    local = build_gallery(digits_onnx, spec, tmp_path / "local", batch_size=16)
    remote = build_gallery(digits_onnx, spec, tmp_path / "ray", batch_size=16, engine="ray", ray_address=cluster)
    assert remote.device["engine"] == "ray" and local.device["engine"] == "local"
    assert (remote.indexed, remote.duplicates, remote.failed, remote.count) == (100, 1, 1, 100)
    assert (local.indexed, local.duplicates, local.failed, local.count) == (100, 1, 1, 100)
    assert report(tmp_path / "ray")["failures"] == report(tmp_path / "local")["failures"]
    a, b = stored(tmp_path / "local"), stored(tmp_path / "ray")
    assert a[0].tolist() == b[0].tolist() and a[1] == b[1] and a[2] == b[2]
    assert np.abs(a[3] - b[3]).max() <= 1e-5
    queries = [str(p) for p in sorted(digit_folder.rglob("0000*.png"))]
    with Gallery.open(tmp_path / "local") as g1, Gallery.open(tmp_path / "ray") as g2:
        for h1, h2 in zip(g1.search(queries, k=5), g2.search(queries, k=5)):
            assert [h.id for h in h1] == [h.id for h in h2]
            assert np.allclose([h.score for h in h1], [h.score for h in h2], atol=1e-5)
    assert verify_gallery(tmp_path / "ray")["ok"]


def test_ray_build_resumes_after_sigkill(cluster, digits_onnx, tmp_path) -> None:
    images = write_flat_folder(tmp_path / "imgs", 400)
    db = tmp_path / "g"
    args = ["index", "build", "--model", str(digits_onnx), "--images", f"files:{images}", "--db", str(db),
            "--batch", "8", "--json", "--engine", "ray", "--ray-address", cluster]
    state = killed_at_batch(db, args, 5)  # SIGKILL right after the 5th committed batch
    assert state["state"] == "building" and 0 < state["job"]["indexed"] < 400, state
    assert state["count"] == state["job"]["indexed"]
    done = cli(*args, "--resume")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["indexed"], summary["duplicates"], summary["failed"], summary["count"]) == (400, 0, 0, 400)
    assert summary["resumed"] == 1 and summary["device"]["engine"] == "ray"
    assert verify_gallery(db)["ok"]
    build_gallery(digits_onnx, f"files:{images}", tmp_path / "local", batch_size=64)
    a, b = stored(tmp_path / "local"), stored(db)
    assert a[0].tolist() == b[0].tolist() == list(range(400)) and a[2] == b[2]
    assert np.abs(a[3] - b[3]).max() <= 1e-5


def test_actor_pool_one_per_gpu_else_cpu_actors() -> None:
    assert cluster_actors({"CPU": 16.0, "GPU": 4.0}) == (4, {"num_gpus": 1})
    assert cluster_actors({"CPU": 16.0, "GPU": 4.0}, device="cpu") == (8, {"num_cpus": 1})
    assert cluster_actors({"CPU": 2.0}) == (1, {"num_cpus": 1})
    assert cluster_actors({"CPU": 8.0}, actors=3) == (3, {"num_cpus": 1})


def test_engine_is_checked(digits_onnx, tmp_path) -> None:
    with pytest.raises(ValueError, match="engine must be one of local, ray"):
        build_gallery(digits_onnx, "digits", tmp_path / "g", engine="spark")
    with pytest.raises(ValueError, match="local engine only"):
        build_gallery(digits_onnx, "digits", tmp_path / "g", engine="ray", embed_step=lambda b: b)
    assert not job_state(tmp_path / "g")
