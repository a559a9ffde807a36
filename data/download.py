"""Downloading the public data sets into the folder a spec names (only when a training config sets download: true)."""

from __future__ import annotations

import shutil
import tarfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

INSHOP_PAGE = "https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion/InShopRetrieval.html"
OMNIGLOT_RAW = "https://raw.githubusercontent.com/brendenlake/omniglot/master/python"


@dataclass(frozen=True)
class Source:
    """One file to fetch; `extracted` is the path it unpacks to (None: used as is)."""

    url: str
    filename: str
    extracted: str | None = None


SOURCES: dict[str, tuple[Source, ...]] = {
    "cub200": (
        Source(
            "https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz?download=1",
            "CUB_200_2011.tgz",
            "CUB_200_2011/images.txt",
        ),
    ),
    "cars196": (
        Source("http://ai.stanford.edu/~jkrause/car196/car_ims.tgz", "car_ims.tgz", "car_ims"),
        Source("http://ai.stanford.edu/~jkrause/car196/cars_annos.mat", "cars_annos.mat"),
    ),
    "sop": (
        Source(
            "ftp://cs.stanford.edu/cs/cvgl/Stanford_Online_Products.zip",
            "Stanford_Online_Products.zip",
            "Stanford_Online_Products/Ebay_train.txt",
        ),
    ),
    "omniglot": (
        Source(f"{OMNIGLOT_RAW}/images_background.zip", "images_background.zip"),
        Source(f"{OMNIGLOT_RAW}/images_evaluation.zip", "images_evaluation.zip"),
    ),
}


def _download(name: str, url: str, target: Path) -> None:
    """Fetch `url` into `target` with a progress bar, via a .part file."""
    part = target.with_name(target.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, part.open("wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=target.name) as bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError) as e:
        part.unlink(missing_ok=True)
        reason = getattr(e, "reason", e)
        raise ConnectionError(
            f"could not download {name} from {url}: {reason}; download it by hand into {target.parent}"
        ) from e
    shutil.move(part, target)


def _extract(archive: Path, into: Path) -> None:
    """Unpack a .zip or .tar(.gz) archive into `into`."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            z.extractall(into)
        return
    with tarfile.open(archive) as tar:
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(into, **safe)


def fetch(name: str, root: Path) -> None:
    """Download and unpack data set `name` into `root`, skipping what is already there."""
    if name == "inshop":
        raise FileNotFoundError(
            f"In-Shop Clothes has no direct download URL (it is shared through Google Drive): get "
            f"list_eval_partition.txt and img.zip from {INSHOP_PAGE} and unpack them into {root}"
        )
    if name not in SOURCES:
        known = ", ".join(sorted(SOURCES))
        raise ValueError(f"{name} cannot be downloaded; downloadable: {known} (inshop by hand)")
    root.mkdir(parents=True, exist_ok=True)
    for src in SOURCES[name]:
        archive = root / src.filename
        if src.extracted is not None and (root / src.extracted).exists():
            continue
        if not archive.exists():
            _download(name, src.url, archive)
        if src.extracted is not None:
            _extract(archive, root)
