"""The grocery:PATH adapter on the real Grocery Store photos: official lists, labels, catalogue, class halves."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from metricsearch.data import load_image_set, load_query_gallery, load_split


def listed(grocery_dir, *lists: str) -> list[tuple[str, int]]:
    """(file name, fine id) of every row of the official lists, read here independently of the adapter."""
    rows = []
    for name in lists:
        for line in (grocery_dir / "dataset" / f"{name}.txt").read_text().splitlines():
            if line.strip():
                path, fine, _ = (f.strip() for f in line.split(","))
                rows.append((path.rsplit("/", 1)[-1], int(fine)))
    return rows


def classes(grocery_dir) -> dict[int, tuple[str, str]]:
    """fine id -> (fine name, coarse name) from classes.csv."""
    with open(grocery_dir / "dataset" / "classes.csv", newline="") as f:
        return {int(r[1]): (r[0], r[2]) for r in list(csv.reader(f))[1:]}


def test_every_listed_photo_with_its_fine_label_and_coarse_group(grocery_dir) -> None:
    names = classes(grocery_dir)
    images = load_image_set(f"grocery:{grocery_dir}")
    got = sorted((p.name, images.class_names[label]) for p, label in zip(images.items, images.labels))
    assert got == sorted((f, names[i][0]) for f, i in listed(grocery_dir, "train", "val", "test"))
    assert len(images.class_names) == len(names)
    coarse = {names[i][0]: names[i][1] for i in names}
    assert all(g == coarse[images.class_names[label]] for g, label in zip(images.groups, images.labels))
    test = load_image_set(f"grocery:{grocery_dir}#test")
    assert sorted(p.name for p in test.items) == sorted(f for f, _ in listed(grocery_dir, "test"))


def test_class_halves_alternate_by_class_id_and_cover_every_class(grocery_dir) -> None:
    names = classes(grocery_dir)
    half1 = set(load_image_set(f"grocery:{grocery_dir}#half1").class_names)
    half2 = set(load_image_set(f"grocery:{grocery_dir}#half2").class_names)
    assert not half1 & half2 and half1 | half2 == {n for n, _ in names.values()}
    ordered = [names[i][0] for i in sorted(names)]
    assert set(ordered[0::2]) == half1 and set(ordered[1::2]) == half2
    for half in ("half1", "half2"):  # fruit, vegetables and packages on both sides
        catalogue = load_image_set(f"grocery:{grocery_dir}#catalogue,{half}").items
        assert {p.relative_to(grocery_dir / "dataset").parts[1] for p in catalogue} == {"Fruit", "Vegetables",
                                                                                       "Packages"}


def test_split_holds_a_half_out_with_the_photo_to_photo_protocol(grocery_dir) -> None:
    for held_out, trained in (("half2", "half1"), ("half1", "half2")):
        spec = f"grocery:{grocery_dir}" + ("" if held_out == "half2" else "#half1")
        split = load_split(spec)
        assert set(split.train.class_names) == set(load_image_set(f"grocery:{grocery_dir}#{trained}").class_names)
        assert not set(split.train.class_names) & set(split.test.class_names)
        query_files = {p.name for p in load_image_set(f"grocery:{grocery_dir}#test,{held_out}").items}
        gallery_files = {p.name for p in load_image_set(f"grocery:{grocery_dir}#train+val,{held_out}").items}
        assert {p.name for p in split.query.items} == query_files
        assert {p.name for p in split.gallery.items} == gallery_files
        assert split.recall_k == (1, 2, 4, 8)
    final = load_split(f"grocery:{grocery_dir}", split="all")
    assert len(final.train) == len(listed(grocery_dir, "train", "val", "test"))


def test_catalogue_queries_share_class_names_with_photos(grocery_dir) -> None:
    query, gallery = load_query_gallery(f"grocery:{grocery_dir}#test,half2", f"grocery:{grocery_dir}#catalogue,half2")
    assert len(gallery) == len(gallery.class_names) == len(set(query.class_names) & set(gallery.class_names))
    assert sorted(gallery.labels.tolist()) == list(range(len(gallery)))
    assert all(p.name.endswith("_Iconic.jpg") for p in gallery.items)
    assert np.array_equal(np.unique(query.labels), np.unique(gallery.labels))


def test_bad_selections_say_what_to_write(grocery_dir, tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown part 'tset'"):
        load_image_set(f"grocery:{grocery_dir}#tset")
    with pytest.raises(ValueError, match="a split takes only a held-out half"):
        load_split(f"grocery:{grocery_dir}#test")
    with pytest.raises(FileNotFoundError, match="classes.csv not found"):
        load_split(f"grocery:{tmp_path}")
