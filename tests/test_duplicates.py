"""Near-duplicates in a gallery: edited copies of real grocery photos, indexed with a real ONNX model into a
real LMDB gallery, found by `metricsearch index duplicates` (faiss range search, connected components)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageEnhance

from metricsearch.index import build_gallery, find_duplicates
from metricsearch.index.duplicates import components

from conftest import SHARED
from index_data import cli
from onnx_models import pixel_correlation_onnx

GROCERY = SHARED / "data" / "grocery" / "dataset" / "test"
EDITS = ("half", "jpeg30", "crop5", "bright")


def edited(image: Image.Image, edit: str) -> Image.Image:
    """A lightly edited copy: half size, JPEG quality 30, 5% of each side cropped away (2.5% per edge),
    or 30% brighter."""
    w, h = image.size
    if edit == "half":
        return image.resize((w // 2, h // 2), Image.Resampling.BILINEAR)
    if edit == "jpeg30":
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=30)
        return Image.open(io.BytesIO(buffer.getvalue()))
    if edit == "crop5":
        dx, dy = round(w * 0.025), round(h * 0.025)
        return image.crop((dx, dy, w - dx, h - dy))
    return ImageEnhance.Brightness(image).enhance(1.3)


@pytest.fixture(scope="module")
def planted_gallery(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A gallery of one photo of each grocery class, with 4 edited copies each of every fourth; and each
    file's name -> the photo it comes from."""
    if not GROCERY.is_dir():
        pytest.skip(f"{GROCERY} not found: the near-duplicate test needs ../shared/data/grocery")
    root = tmp_path_factory.mktemp("grocery")
    source = {}
    classes = sorted({p.parent for p in GROCERY.rglob("*.jpg")})
    for n, folder in enumerate(classes):
        photo = sorted(folder.glob("*.jpg"))[0]
        (root / folder.name).mkdir(exist_ok=True)
        image = Image.open(photo).convert("RGB")
        image.save(root / folder.name / f"{n:03d}.png")
        source[f"{n:03d}.png"] = f"{n:03d}"
        if n % 4 == 0:
            for edit in EDITS:
                edited(image, edit).save(root / folder.name / f"{n:03d}_{edit}.jpg", quality=95)
                source[f"{n:03d}_{edit}.jpg"] = f"{n:03d}"
    model = pixel_correlation_onnx(tmp_path_factory.mktemp("model") / "pixels.onnx")
    db = root.parent / "gallery"
    build_gallery(model, f"folder:{root}", db, progress=False)
    return db, source


def test_every_planted_copy_is_found_and_no_unrelated_pair(planted_gallery) -> None:
    db, source = planted_gallery
    groups = find_duplicates(db)
    found = [{Path(item["path"]).name for item in group["items"]} for group in groups]
    planted = {}
    for name, photo in source.items():
        planted.setdefault(photo, set()).add(name)
    expected = [names for names in planted.values() if len(names) > 1]
    assert len(expected) >= 4
    assert sorted(map(sorted, found)) == sorted(map(sorted, expected))
    assert all(group["size"] == 1 + len(EDITS) and group["min_similarity"] >= 0.95 for group in groups)


def test_cli_prints_the_groups_as_json_and_draws_them(planted_gallery, tmp_path: Path) -> None:
    db, _ = planted_gallery
    done = cli("index", "duplicates", "--db", str(db), "--json", "--report", str(tmp_path / "dups"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == find_duplicates(db)
    with Image.open(tmp_path / "dups" / "duplicates.png") as image:
        image.load()
        assert image.height > 100
    done = cli("index", "duplicates", "--db", str(db), "--threshold", "1.5")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_components_match_scipy_on_a_random_graph() -> None:
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    rng = np.random.default_rng(0)
    n = 3000
    a, b = rng.integers(0, n, 2500), rng.integers(0, n, 2500)
    ours = components(n, a, b)
    _, theirs = connected_components(coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n)), directed=False)
    # the same partition: each of our components is exactly one of scipy's
    pairs = np.unique(np.stack([ours, theirs], axis=1), axis=0)
    assert len(pairs) == len(np.unique(ours)) == len(np.unique(theirs))
