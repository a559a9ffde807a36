"""The shipped Grocery Store recipe and the demo's photo parts on the real photos (no long training)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from metricsearch.app.demo import compare_with_off_the_shelf, format_photo_comparison, grocery_specs
from metricsearch.data import load_query_gallery, load_split
from metricsearch.models.torch_embedder import build_embedder
from metricsearch.train.config import load_config, typed_config
from metricsearch.train.trainer import build_components

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "grocery.yaml"


def test_packaged_recipe_finds_the_shared_photos_from_any_folder_and_builds(grocery_dir, monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)  # the recipe names ../../shared from its own folder, configs/
    config = typed_config(load_config(RECIPE))
    split = load_split(config.dataset, split=config.split)
    assert len(split.train.class_names) == 41 and len(split.test) == 0  # the final fit: every class trains
    loss, sampler, _, _ = build_components(config, split.train)
    batch = next(iter(sampler))
    assert len(batch) == config.sampler["classes_per_batch"] * config.sampler["images_per_class"]
    assert config.model.pretrained == "imagenet" and config.num_workers > 0  # decoding overlaps compute
    # the frozen trunk the recipe names exists in its backbone
    model = build_embedder(config.model.model_dump(mode="json"))
    assert model.trunk is not None and config.trunk_cache > 0


def test_demo_specs_name_the_held_out_half_photos_and_catalogue(grocery_dir) -> None:
    assert grocery_specs("digits") is None and grocery_specs(f"folder:{grocery_dir}") is None
    for spec, half in ((f"grocery:{grocery_dir}", "half2"), (f"grocery:{grocery_dir}#half1", "half1")):
        specs = grocery_specs(spec)
        held_out = load_split(spec).test
        query, gallery = load_query_gallery(specs["query"], specs["gallery"])
        _, catalogue = load_query_gallery(specs["query"], specs["catalogue"])
        assert sorted(query.class_names) == sorted(held_out.class_names) and half in specs["catalogue"]
        assert len(query) + len(gallery) == len(held_out)
        assert sorted(catalogue.class_names[i] for i in catalogue.labels) == sorted(held_out.class_names)


def mini_grocery(grocery_dir: Path, root: Path, classes: int = 4, photos: int = 3) -> Path:
    """A Grocery Store layout of the first `classes` classes with `photos` photos per list, linked to the real ones."""
    source = grocery_dir / "dataset"
    lines = (source / "classes.csv").read_text().splitlines()
    kept = lines[1:classes + 1]
    ids = {line.split(",")[1] for line in kept}
    (root).mkdir()
    (root / "classes.csv").write_text("\n".join([lines[0], *kept]) + "\n")
    for name in ("train", "val", "test"):
        rows: list[str] = []
        for line in (source / f"{name}.txt").read_text().splitlines():
            fields = [f.strip() for f in line.split(",")]
            if (len(fields) > 1 and fields[1] in ids
                    and sum(r.split(",")[1].strip() == fields[1] for r in rows) < photos):
                rows.append(line)
        (root / f"{name}.txt").write_text("\n".join(rows) + "\n")
    for line in [*kept]:
        iconic = line.split(",")[4].lstrip("/")
        (root / iconic).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(source / iconic, root / iconic)
    for name in ("train", "val", "test"):
        for line in (root / f"{name}.txt").read_text().splitlines():
            path = line.split(",")[0].strip()
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(source / path, root / path)
    return root


def test_demo_compares_off_the_shelf_and_fine_tuned_figures_on_real_photos(grocery_dir, tmp_path) -> None:
    root = mini_grocery(grocery_dir, tmp_path / "grocery")
    specs = grocery_specs(f"grocery:{root}")
    baseline = tmp_path / "off.onnx"
    figures = compare_with_off_the_shelf(specs, baseline, baseline, "efficientnet_lite0")  # the same model twice
    assert baseline.is_file()
    assert figures["off-the-shelf"] == figures["fine-tuned"]
    values = np.array(list(figures["off-the-shelf"].values()))
    assert ((values >= 0) & (values <= 1)).all() and values.max() > 0.5, figures  # 2 classes: chance is 0.5
    text = format_photo_comparison(figures)
    assert "photo -> catalogue accuracy@1" in text and f"{figures['fine-tuned']['photo_map_at_r']:.3f}" in text
