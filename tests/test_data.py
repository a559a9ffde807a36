"""Tests for metricsearch.data: every adapter on tiny trees built here, plus bad input."""

from __future__ import annotations

import io
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from PIL import Image

from metricsearch.data import DataSplit, ImageSet, adapters, load_image_set, load_split

SMALL_K = (1, 2, 4, 8, 16, 32)
SHARED_OMNIGLOT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "omniglot"


def write_image(path: Path, value: int, mode: str = "RGB", size: int = 8) -> Path:
    """Write a small flat image (format from the suffix) and return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (size, size), value if mode != "RGB" else (value, value, value)).save(path)
    return path


def png_bytes(value: int) -> bytes:
    """A tiny 1-bit PNG as Omniglot stores its drawings."""
    buf = io.BytesIO()
    Image.new("1", (6, 6), value).save(buf, format="PNG")
    return buf.getvalue()


def check_split(split: DataSplit, recall_k: tuple[int, ...]) -> None:
    """Labels contiguous per set, class names disjoint between train and test, recall_k as documented."""
    assert split.recall_k == recall_k
    for part in (split.train, split.test):
        assert part.labels.dtype == np.int64
        assert len(part.labels) == len(part.items)
        assert sorted(set(part.labels.tolist())) == list(range(len(part.class_names)))
    assert not set(split.train.class_names) & set(split.test.class_names)


def named_counts(s: ImageSet) -> dict[str, int]:
    """Class name -> image count."""
    return {s.class_names[k]: v for k, v in s.class_counts().items()}


@pytest.fixture
def class_tree(tmp_path: Path) -> Path:
    """Four class folders a..d with 2, 3, 2, 2 PNG/JPG images and a stray text file."""
    root = tmp_path / "classes"
    for name, n in zip("abcd", (2, 3, 2, 2)):
        for i in range(n):
            write_image(root / name / f"{i}.{'png' if i % 2 else 'JPG'}", 40 * i)
    (root / "a" / "readme.txt").write_text("not an image")
    return root


# --- digits -----------------------------------------------------------------------------------


def test_digits_split_classes_0_to_4_train_5_to_9_test():
    split = load_split("digits")
    check_split(split, SMALL_K)
    assert split.train.class_names == ["0", "1", "2", "3", "4"]
    assert split.test.class_names == ["5", "6", "7", "8", "9"]
    assert len(split.train) + len(split.test) == 1797
    assert (len(split.train), len(split.test)) == (901, 896)
    img = split.test.load(0)
    assert img.mode == "L" and img.size == (8, 8)
    arr = np.concatenate([np.ravel(a) for a in split.train.items])
    assert arr.dtype == np.uint8 and arr.max() == 255 and arr.min() == 0


# --- folder -----------------------------------------------------------------------------------


def test_folder_split_classes_by_sorted_name(class_tree: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        split = load_split(f"folder:{class_tree}", split_classes=0.5)
    check_split(split, SMALL_K)
    assert named_counts(split.train) == {"a": 2, "b": 3}
    assert named_counts(split.test) == {"c": 2, "d": 2}
    assert split.train.items[0] == class_tree / "a" / "0.JPG"
    assert split.train.load(0).mode == "RGB"


def test_folder_train_test_subfolders(tmp_path: Path):
    for part, names in (("train", "pq"), ("test", "rst")):
        for name in names:
            write_image(tmp_path / part / name / "x.png", 10, mode="L")
    split = load_split(f"folder:{tmp_path}")
    check_split(split, SMALL_K)
    assert split.train.class_names == ["p", "q"]
    assert split.test.class_names == ["r", "s", "t"]
    assert split.test.load(2).mode == "L"


def test_load_image_set_whole_folder(class_tree: Path):
    s = load_image_set(f"folder:{class_tree}")
    assert s.class_names == ["a", "b", "c", "d"]
    assert len(s) == 9
    assert s.class_counts() == {0: 2, 1: 3, 2: 2, 3: 2}
    sub = s.subset([2, 8])
    assert sub.labels.tolist() == [1, 3] and sub.class_names == s.class_names


# --- cub200 -----------------------------------------------------------------------------------


def test_cub200_classes_1_to_100_train(tmp_path: Path):
    root = tmp_path / "CUB_200_2011"  # the spec may name its parent: the adapter looks one level down
    classes = {1: "001.Albatross", 2: "002.Auklet", 101: "101.Crow", 102: "102.Raven"}
    images, labels = [], []
    for cid, name in classes.items():
        for i in range(2):
            rel = f"{name}/{name}_{i}.jpg"
            write_image(root / "images" / rel, 20 * i)
            images.append(rel)
            labels.append(cid)
    (root / "classes.txt").write_text("".join(f"{c} {n}\n" for c, n in classes.items()))
    (root / "images.txt").write_text("".join(f"{i + 1} {p}\n" for i, p in enumerate(images)))
    (root / "image_class_labels.txt").write_text("".join(f"{i + 1} {c}\n" for i, c in enumerate(labels)))
    split = load_split(f"cub200:{tmp_path}")
    check_split(split, SMALL_K)
    assert split.train.class_names == ["001.Albatross", "002.Auklet"]
    assert split.test.class_names == ["101.Crow", "102.Raven"]
    assert split.test.class_counts() == {0: 2, 1: 2}
    assert split.test.items[0] == root / "images" / "101.Crow" / "101.Crow_0.jpg"


# --- cars196 ----------------------------------------------------------------------------------


def test_cars196_classes_1_to_98_train(tmp_path: Path):
    classes = [1, 1, 2, 98, 99, 99, 196]
    ann = np.zeros((len(classes),), dtype=[(f, "O") for f in (
        "relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test")])
    for i, c in enumerate(classes):
        rel = f"car_ims/{i + 1:06d}.jpg"
        write_image(tmp_path / rel, 5 * i)
        ann[i] = (rel, np.uint8(0), np.uint8(0), np.uint8(7), np.uint8(7), np.uint8(c), np.uint8(i % 2))
    names = np.array([f"Make Model {c}" for c in range(1, 197)], dtype=object)
    mat = {"annotations": ann.reshape(1, -1), "class_names": names.reshape(1, -1)}
    scipy.io.savemat(tmp_path / "cars_annos.mat", mat)
    split = load_split(f"cars196:{tmp_path}")
    check_split(split, SMALL_K)
    assert split.train.class_names == ["Make Model 1", "Make Model 2", "Make Model 98"]
    assert split.test.class_names == ["Make Model 99", "Make Model 196"]
    assert split.train.class_counts() == {0: 2, 1: 1, 2: 1}
    assert split.test.class_counts() == {0: 2, 1: 1}


# --- sop --------------------------------------------------------------------------------------


def test_sop_train_and_test_index_files(tmp_path: Path):
    header = "image_id class_id super_class_id path\n"
    indexes = {
        "Ebay_train.txt": [(1, 1, "bicycle_final/1_0.JPG"), (1, 1, "bicycle_final/1_1.JPG"),
                           (2, 2, "chair_final/2_0.JPG")],
        "Ebay_test.txt": [(3, 1, "bicycle_final/3_0.JPG"), (4, 2, "chair_final/4_0.JPG"),
                          (4, 2, "chair_final/4_1.JPG")],
    }
    for index, rows in indexes.items():
        lines = [header]
        for i, (cid, sup, rel) in enumerate(rows):
            write_image(tmp_path / rel, 30 * i)
            lines.append(f"{i + 1} {cid} {sup} {rel}\n")
        (tmp_path / index).write_text("".join(lines))
    split = load_split(f"sop:{tmp_path}")
    check_split(split, (1, 10, 100, 1000))
    assert split.train.class_names == ["bicycle_final/1", "chair_final/2"]
    assert split.test.class_names == ["bicycle_final/3", "chair_final/4"]
    assert split.train.class_counts() == {0: 2, 1: 1}
    assert split.test.class_counts() == {0: 1, 1: 2}
    assert list(split.train.groups) == ["bicycle_final", "bicycle_final", "chair_final"]  # super_class batches
    assert list(split.test.groups) == ["bicycle_final", "chair_final", "chair_final"]


# --- inshop -----------------------------------------------------------------------------------


@pytest.mark.parametrize("official_layout", [False, True])
def test_inshop_query_and_gallery_share_labels(tmp_path: Path, official_layout: bool):
    rows = [
        ("id_00000001", "train", 2), ("id_00000002", "train", 1),
        ("id_00000003", "query", 1), ("id_00000003", "gallery", 2),
        ("id_00000004", "query", 2), ("id_00000004", "gallery", 1), ("id_00000005", "gallery", 1),
    ]
    part_dir = tmp_path / "Eval" if official_layout else tmp_path
    img_dir = tmp_path / "Img" if official_layout else tmp_path
    lines = [f"{sum(n for *_, n in rows)}\n", "image_name item_id evaluation_status\n"]
    for item, status, n in rows:
        for i in range(n):
            rel = f"img/WOMEN/Dresses/{item}/{status}_{i}_front.jpg"
            write_image(img_dir / rel, 10 * i)
            lines.append(f"{rel} {item} {status}\n")
    part_dir.mkdir(exist_ok=True)
    (part_dir / "list_eval_partition.txt").write_text("".join(lines))
    split = load_split(f"inshop:{tmp_path}")
    check_split(split, (1, 10, 20, 30, 40, 50))
    assert split.train.class_names == ["id_00000001", "id_00000002"]
    assert split.test.class_names == ["id_00000003", "id_00000004", "id_00000005"]
    assert (len(split.query), len(split.gallery), len(split.test)) == (3, 4, 7)
    assert split.query.class_names == split.gallery.class_names == split.test.class_names
    q = {split.query.class_names[label] for label in split.query.labels}
    g = {split.gallery.class_names[label] for label in split.gallery.labels}
    assert q == {"id_00000003", "id_00000004"} and g == {"id_00000003", "id_00000004", "id_00000005"}
    for label in set(split.query.labels.tolist()):
        gallery_items = [split.gallery.items[i] for i in np.flatnonzero(split.gallery.labels == label)]
        query_items = [split.query.items[i] for i in np.flatnonzero(split.query.labels == label)]
        assert {p.parent for p in gallery_items} == {p.parent for p in query_items}
    assert all(p.is_file() for p in split.query.items + split.gallery.items)


# --- omniglot ---------------------------------------------------------------------------------


def omniglot_zip(path: Path, top: str, alphabets: dict[str, int]) -> None:
    """An Omniglot-style archive: `top/<Alphabet>/characterNN/<id>_<drawer>.png`, 2 drawings each."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{top}/", "")
        for alphabet, n_chars in alphabets.items():
            for c in range(1, n_chars + 1):
                for d in (1, 2):
                    z.writestr(f"{top}/{alphabet}/character{c:02d}/{c:02d}{d}_{d:02d}.png", png_bytes(d % 2))


def omniglot_folder(root: Path, alphabets: dict[str, int]) -> None:
    """An extracted Omniglot set folder with 2 drawings per character."""
    for alphabet, n_chars in alphabets.items():
        for c in range(1, n_chars + 1):
            for d in (1, 2):
                path = root / alphabet / f"character{c:02d}" / f"{c:02d}{d}_{d:02d}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(png_bytes(d % 2))


def test_omniglot_background_only_zips_split_by_alphabet(tmp_path: Path):
    for n, alphabets in ((1, {"Alpha": 2, "Beta": 3, "Gamma": 2}), (2, {"Beta": 3, "Delta": 2, "Epsilon": 2})):
        omniglot_zip(tmp_path / f"images_background_small{n}.zip", f"images_background_small{n}", alphabets)
    split = load_split(f"omniglot:{tmp_path}")
    check_split(split, SMALL_K)
    # sorted alphabets Alpha Beta Delta Epsilon Gamma: indices 1 and 3 (Beta, Epsilon) go to test
    assert {n.split("/")[0] for n in split.train.class_names} == {"Alpha", "Delta", "Gamma"}
    assert {n.split("/")[0] for n in split.test.class_names} == {"Beta", "Epsilon"}
    assert len(split.test.class_names) == 5 and len(split.test) == 10  # Beta deduplicated
    assert len(split.train.class_names) == 6 and len(split.train) == 12
    assert "Beta/character01" in split.test.class_names
    assert any("Beta, Epsilon" in n for n in split.notes)
    assert any("dropped 6 duplicate" in n for n in split.notes)
    img = split.train.load(0)
    assert img.mode == "L" and img.size == (6, 6)
    assert isinstance(split.train.items[0], np.ndarray)


def test_omniglot_folders_background_train_evaluation_test(tmp_path: Path):
    omniglot_folder(tmp_path / "images_background", {"Alpha": 2, "Beta": 1})
    omniglot_zip(tmp_path / "images_evaluation.zip", "images_evaluation", {"Zeta": 1, "Eta": 2})
    split = load_split(f"omniglot:{tmp_path}")
    check_split(split, SMALL_K)
    assert split.train.class_names == ["Alpha/character01", "Alpha/character02", "Beta/character01"]
    assert split.test.class_names == ["Eta/character01", "Eta/character02", "Zeta/character01"]
    assert split.train.class_counts() == {0: 2, 1: 2, 2: 2}
    assert isinstance(split.train.items[0], Path)
    img = split.train.load(0)
    assert img.mode == "L" and img.size == (6, 6)  # stored as 1-bit, loaded as "L"
    assert not any("split by sorted name" in n for n in split.notes)


def test_omniglot_shared_data():
    if not SHARED_OMNIGLOT.is_dir():
        pytest.skip(f"../shared/data/omniglot not found: {SHARED_OMNIGLOT} (the real-data check needs it)")
    split = load_split(f"omniglot:{SHARED_OMNIGLOT}")
    check_split(split, SMALL_K)
    assert len(split.train.class_names) + len(split.test.class_names) == 242
    assert len(split.train) + len(split.test) == 4840
    train_alphabets = {n.split("/")[0] for n in split.train.class_names}
    test_alphabets = {n.split("/")[0] for n in split.test.class_names}
    assert train_alphabets == {"Balinese", "Greek", "Korean", "Sanskrit"}
    assert test_alphabets == {"Early_Aramaic", "Japanese_(katakana)", "Latin", "Tagalog"}
    assert set(split.train.class_counts().values()) == {20}
    img = split.test.load(0)
    assert img.mode == "L" and img.size == (105, 105)


# --- bad input --------------------------------------------------------------------------------


def test_missing_path(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_split(f"folder:{tmp_path / 'nope'}", split_classes=0.5)
    with pytest.raises(FileNotFoundError, match="download: true"):
        load_split(f"cub200:{tmp_path / 'nope'}")
    with pytest.raises(FileNotFoundError, match="images.txt not found"):
        load_split(f"cub200:{tmp_path}")
    with pytest.raises(FileNotFoundError, match="images_background"):
        load_split(f"omniglot:{tmp_path}")


def test_unreadable_image_skipped_with_one_counting_warning(class_tree: Path):
    (class_tree / "b" / "broken.jpg").write_text("this is not a JPEG")
    (class_tree / "c" / "empty.PNG").write_bytes(b"")
    with pytest.warns(UserWarning, match=r"skipped 2 unreadable image\(s\)") as record:
        split = load_split(f"folder:{class_tree}", split_classes=0.5)
    assert len(record) == 1
    assert named_counts(split.train) == {"a": 2, "b": 3}
    assert named_counts(split.test) == {"c": 2, "d": 2}


def test_load_names_the_unreadable_file(tmp_path: Path):
    bad = tmp_path / "gone.png"
    s = ImageSet(items=[bad], labels=np.zeros(1, dtype=np.int64), class_names=["x"])
    with pytest.raises(OSError, match="gone.png"):
        s.load(0)


def test_unknown_spec_lists_known_adapters():
    with pytest.raises(ValueError, match="did you mean cub200:PATH") as info:
        load_split("cub:/data")
    for usage, _ in adapters():
        assert usage in str(info.value)
    assert [u for u, _ in adapters()] == [
        "digits", "folder:PATH", "omniglot:PATH", "cub200:PATH", "cars196:PATH", "sop:PATH", "inshop:PATH",
        "grocery:PATH", "files:PATH", "csv:FILE"]


def test_spec_without_path_and_path_for_digits():
    with pytest.raises(ValueError, match="folder:PATH"):
        load_split("folder")
    with pytest.raises(ValueError, match="takes no path"):
        load_split("digits:/x")
    with pytest.raises(ValueError, match="csv:FILE"):
        load_image_set("csv")


def test_empty_class_folder_is_named(class_tree: Path):
    (class_tree / "e_empty").mkdir()
    with pytest.raises(ValueError, match="e_empty"):
        load_split(f"folder:{class_tree}", split_classes=0.5)


def test_folder_without_split(class_tree: Path):
    with pytest.raises(ValueError, match="pass split_classes=F"):
        load_split(f"folder:{class_tree}")


def test_split_with_fewer_than_two_classes(class_tree: Path):
    with pytest.raises(ValueError, match="train part has 1 class"):
        load_split(f"folder:{class_tree}", split_classes=0.25)


def test_folder_with_no_images(tmp_path: Path):
    with pytest.raises(ValueError, match="no class sub-folders"):
        load_split(f"folder:{tmp_path}", split_classes=0.5)


def test_split_classes_rejected_for_fixed_splits():
    with pytest.raises(ValueError, match="fixed class split"):
        load_split("digits", split_classes=0.5)


def test_high_bit_depth_images_scale_to_8_bit_exactly():
    from metricsearch.data.images import to_mode

    every = np.arange(65536, dtype=np.uint16).reshape(256, 256)  # every 16-bit value, converted in row chunks
    expected = np.floor(every.astype(np.float64) * 255 / 65535 + 0.5).astype(np.uint8)
    assert np.array_equal(np.asarray(to_mode(Image.fromarray(every), None)), expected)
    wide = np.array([[-5, 0, 255, 70000]], dtype=np.int32)  # 32-bit: clipped to 0..65535, then scaled
    assert np.asarray(to_mode(Image.frombytes("I", (4, 1), wide.tobytes()), None)).tolist() == [[0, 0, 1, 255]]
    small = np.array([[0, 7, 255]], dtype=np.int32)  # every value fits in 8 bits: kept as is
    assert np.asarray(to_mode(Image.frombytes("I", (3, 1), small.tobytes()), None)).tolist() == [[0, 7, 255]]
