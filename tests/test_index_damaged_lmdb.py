"""A gallery's LMDB file cut short, with zeroed or random pages or a wrong meta page, or with damaged stored
bytes: `index verify`, `index info`, `search`, `serve` and opening the gallery as `serve` does (real
subprocesses) never crash, print no traceback and never hang. Each says in one line that data.mdb is damaged;
`verify` (exit 1) also names the item whose thumbnail or vector no longer matches its checksum. Only damage is
reported as damage: an id no item can have is "no item", a healthy file whose free pages hold old bytes is ok."""

from __future__ import annotations

import json
import logging
import shutil
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import lmdb
import numpy as np
import pytest
from index_data import cli, one_line, write_flat_folder
from PIL import Image

from metricsearch.app.cli import main
from metricsearch.index import Gallery, add_images, build_gallery, verify_gallery
from metricsearch.index.lmdb_store import LMDB_DIR, WALKED, Store

# `index verify`, `index info` and `search` as the console script runs them, then `Gallery.open` as `serve` does
# first, one after the other in one process (one interpreter start for the four): a marker line on stderr before
# each, its exit status on stdout; a crash ends the process (it is a crash of the command whose marker is last)
COMMANDS = """import sys
from metricsearch.app.cli import main
from metricsearch.index import Gallery
from metricsearch.index.lmdb_store import DamagedGallery
db, query = sys.argv[1:]
for args in (["index", "verify", "--db", db], ["index", "info", "--db", db], ["search", "--db", db, "--image", query]):
    print(f"--- command: {args[0] if args[0] == 'search' else args[1]}", file=sys.stderr, flush=True)
    print(main(args), flush=True)
print("--- command: open", file=sys.stderr, flush=True)
try:
    Gallery.open(db).close()
    print(0)
except DamagedGallery as exc:
    print(f"damaged: {exc}", file=sys.stderr)
    print(1)
"""
HANG_S = 120  # a command that has not ended by then hangs (each takes about a second)


@pytest.fixture(scope="module")
def gallery(digits_onnx, tmp_path_factory) -> dict:
    """A built gallery (120 small images, 8 of noise whose 4 KB thumbnails take pages of their own), a query
    image, and what the damage below aims at: a large thumbnail, a vector and an item's path, with their ids."""
    root = tmp_path_factory.mktemp("lmdb")
    images = write_flat_folder(root / "imgs", 120)
    rng = np.random.default_rng(0)
    for i in range(8):
        Image.fromarray(rng.integers(0, 256, (64, 64), np.uint8), "L").save(images / f"noise{i}.png")
    build_gallery(digits_onnx, f"files:{images}", root / "g", batch_size=32)
    with Gallery.open(root / "g") as g:
        big = max(g.catalog.ids.tolist(), key=lambda i: len(g.thumbnail(i)))
        targets = {"thumbnail": g.thumbnail(big), "thumbnail_id": big, "vector": g.vectors([7])[1][0].tobytes(),
                   "path": g.item(len(g) - 1)["path"].encode()}
    assert len(targets["thumbnail"]) > 4096  # a value on pages of its own (LMDB's overflow pages)
    return {"db": root / "g", "query": str(images / "00003.png"), **targets}


def lmdb_layout(data: bytes) -> dict:
    """Where things are in a 64-bit LMDB 0.9 file: page size, the newer meta page's offset and its last page, and
    the root pages of the free list, the main table and each named table."""
    psize = struct.unpack_from("<I", data, 40)[0]  # meta page 0: the free list's MDB_db keeps it
    meta = max((0, psize), key=lambda at: struct.unpack_from("<Q", data, at + 144)[0])  # the newer txn id's
    free, top, last = (struct.unpack_from("<Q", data, meta + at)[0] for at in (80, 128, 136))
    out = {"psize": psize, "meta": meta, "last": last, "free list": free, "main table": top}
    lower = struct.unpack_from("<H", data, top * psize + 12)[0]
    for i in range((lower - 16) // 2):  # the main table is one leaf here: a node (key: name, data: MDB_db) a table
        node = top * psize + struct.unpack_from("<H", data, top * psize + 16 + 2 * i)[0]
        ksize = struct.unpack_from("<H", data, node + 6)[0]
        out[data[node + 8:node + 8 + ksize].decode()] = struct.unpack_from("<Q", data, node + 8 + ksize + 40)[0]
    return out


def put(data: bytes, offset: int, raw: bytes) -> bytes:
    return data[:offset] + raw + data[offset + len(raw):]


def copies(data: bytes, pattern: bytes) -> list[int]:
    """Where `pattern` starts in `data`: its live copy and any old ones in the file's free pages."""
    found = [data.find(pattern)]
    while found[-1] >= 0:
        found.append(data.find(pattern, found[-1] + 1))
    assert len(found) > 1, "not in the file"
    return found[:-1]


def everywhere(data: bytes, pattern: bytes, offset: int, raw: bytes) -> bytes:
    """`raw` written at `offset` from each copy of `pattern`."""
    for at in copies(data, pattern):
        data = put(data, at + offset, raw)
    return data


def on_leaves(data: bytes, pattern: bytes, offset: int, raw: bytes, psize: int) -> bytes:
    """`raw` written at `offset` of each leaf page that holds `pattern`."""
    for page in sorted({at // psize for at in copies(data, pattern)}):
        assert struct.unpack_from("<H", data, page * psize + 10)[0] == 2  # P_LEAF
        data = put(data, page * psize + offset, raw)
    return data


def random_pages(data: bytes, psize: int, last: int, n: int = 10) -> bytes:
    """`n` pages of random bytes, at random among pages 2 to `last`."""
    for page in np.random.default_rng(1).choice(np.arange(2, last + 1), n, replace=False):
        data = put(data, int(page) * psize, noise(psize, int(page)))
    return data


def zeroed(page: int | str):
    return lambda d, at: put(d, (at[page] if isinstance(page, str) else page) * at["psize"], bytes(at["psize"]))


def noise(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).bytes(n)


DAMAGE = {  # name -> (bytes of data.mdb, its layout and targets) -> damaged bytes
    "cut to 25%": lambda d, at: d[:len(d) // 4],
    "cut to 50%": lambda d, at: d[:len(d) // 2],
    "cut to 75%": lambda d, at: d[:len(d) * 3 // 4],
    "cut to 90%": lambda d, at: d[:len(d) * 9 // 10],
    "cut to 97%": lambda d, at: d[:len(d) * 97 // 100],
    "cut by one page": lambda d, at: d[:-at["psize"]],
    "cut mid-page": lambda d, at: d[:-100],
    "cut to the two meta pages": lambda d, at: d[:2 * at["psize"]],
    "cut inside meta page 0": lambda d, at: d[:100],
    "empty": lambda d, at: b"",
    "zeroed meta page 0": zeroed(0),
    "zeroed meta page 1": zeroed(1),
    "wrong magic": lambda d, at: put(d, at["meta"] + 16, b"\xde\xad\xbe\xef"),
    "wrong version": lambda d, at: put(d, at["meta"] + 20, struct.pack("<I", 2)),
    "last page past the end": lambda d, at: put(d, at["meta"] + 136, struct.pack("<Q", 1 << 20)),
    "main root past the end": lambda d, at: put(d, at["meta"] + 128, struct.pack("<Q", 1 << 20)),
    "zeroed main-table root": zeroed("main table"),
    "zeroed free-list root": zeroed("free list"),
    "zeroed embeddings root": zeroed("embeddings"),
    "zeroed page 5": zeroed(5),
    "random page 5": lambda d, at: put(d, 5 * at["psize"], noise(at["psize"], 5)),
    "random pages": lambda d, at: random_pages(d, at["psize"], at["last"]),
    "random node offsets on a leaf": lambda d, at: on_leaves(d, at["path"], 16, noise(64, 2), at["psize"]),
    "random node bytes on a leaf": lambda d, at: on_leaves(d, at["path"], at["psize"] - 200, noise(64, 3),
                                                           at["psize"]),
    "items root marked a leaf": lambda d, at: put(d, at["items"] * at["psize"] + 10, struct.pack("<H", 2)),
    # the stored bytes of one item: LMDB reads them without fault, the checksums find them
    "zeroed first page of a thumbnail": lambda d, at: everywhere(d, at["thumbnail"], -16, bytes(at["psize"])),
    "64 random bytes in a thumbnail": lambda d, at: everywhere(d, at["thumbnail"], 300, noise(64, 4)),
    "random bytes in a vector": lambda d, at: everywhere(d, at["vector"], 8, noise(8, 6)),
}
IN_ITEM = {"zeroed first page of a thumbnail": "thumbnail", "64 random bytes in a thumbnail": "thumbnail",
           "random bytes in a vector": "vector"}


def damaged_copy(gallery: dict, root: Path, kind: str) -> Path:
    db = root / kind.replace(" ", "_").replace("%", "pc")
    shutil.copytree(gallery["db"], db)
    data = db / LMDB_DIR / "data.mdb"
    raw = data.read_bytes()
    damaged = DAMAGE[kind](raw, {**lmdb_layout(raw), **gallery})
    assert damaged != raw, kind
    data.write_bytes(damaged)
    return db


def run(args: list[str]) -> tuple[int | str, str, str]:
    """(exit status, or "hang"; stdout; stderr) of `python ARGS`."""
    try:
        done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=HANG_S)
    except subprocess.TimeoutExpired:
        return "hang", "", ""
    return done.returncode, done.stdout, done.stderr


def outcomes(code: int | str, out: str, err: str) -> dict:
    """{command: (exit status, its stderr)} of a COMMANDS run; a command that ended the process gets its status."""
    codes = [int(line) for line in out.splitlines() if line.lstrip("-").isdigit()]
    said: dict[str, list[str]] = {}
    for line in err.splitlines():
        if line.startswith("--- command: "):
            said[line.split(": ")[1]] = []
        elif said:
            said[list(said)[-1]].append(line)
    result = {name: (codes[i] if i < len(codes) else code, "\n".join(lines)) for i, (name, lines) in
              enumerate(said.items())}
    return {name: result.get(name, ("not run", "")) for name in ("verify", "info", "search", "open")}


def test_28_kinds_of_lmdb_damage_crash_no_command_and_each_is_named(gallery, tmp_path, free_port) -> None:
    assert len(DAMAGE) == 28
    runs = {}
    for kind in DAMAGE:
        runs[kind] = ["-c", COMMANDS, str(damaged_copy(gallery, tmp_path, kind)), gallery["query"]]
    # the whole `serve` once (gradio takes seconds to import), where LMDB's assertion aborted it before (SIGABRT)
    runs["zeroed page 5", "serve"] = ["-m", "metricsearch", "serve", "--db", runs["zeroed page 5"][2], "--port",
                                      str(free_port)]
    with ThreadPoolExecutor(4) as pool:
        done = dict(zip(runs, pool.map(run, runs.values())))
    results = {(kind, command): result for kind in DAMAGE for command, result in outcomes(*done[kind]).items()}
    for kind, command in [key for key in runs if isinstance(key, tuple)]:
        results[kind, command] = (done[kind, command][0], done[kind, command][2])
    failed = []
    for (kind, command), (code, err) in results.items():
        data = str(Path(runs[kind][2]) / LMDB_DIR / "data.mdb")
        if command == "verify":
            named = f"item {gallery['thumbnail_id'] if IN_ITEM[kind] == 'thumbnail' else 7} ({IN_ITEM[kind]})" \
                if kind in IN_ITEM else f"{data} is damaged"
            ok = code == 1 and named in err and "Traceback" not in err
        elif kind in IN_ITEM:  # bytes these commands do not read
            ok = code == 0 and not err.strip()
        else:
            lines = err.strip().splitlines()
            ok = code == (1 if command == "open" else 2) and len(lines) == 1 and f"{data} is damaged" in lines[0]
        if not ok:
            failed.append((kind, command, code, err[-300:]))
    assert not failed, failed
    assert len(results) == 28 * 4 + 1


def test_a_gallery_written_before_checksums_opens_and_verifies_with_a_note(gallery, tmp_path) -> None:
    db = tmp_path / "g"
    shutil.copytree(gallery["db"], db)
    env = lmdb.open(str(db / LMDB_DIR), max_dbs=16)
    with env.begin(write=True) as txn:  # as metricsearch wrote it before checksums
        txn.drop(env.open_db(b"checksums", txn=txn, create=False), delete=True)
    env.close()
    check = verify_gallery(db)
    assert check["ok"] and check["count"] == 128, check
    assert any(note.startswith("no checksums: ") for note in check["notes"]), check
    with Gallery.open(db) as g:
        assert len(g) == 128
    more = write_flat_folder(tmp_path / "more", 130)  # the first 120 are in the gallery already
    add_images(db, f"files:{more}")
    check = verify_gallery(db)
    assert check["ok"] and check["count"] == 138, check
    assert "128 item(s) have no checksums: added before metricsearch stored them" in check["notes"], check


def test_a_healthy_file_whose_free_pages_hold_old_value_bytes_verifies_ok(gallery, tmp_path) -> None:
    db = tmp_path / "g"
    shutil.copytree(gallery["db"], db)
    with Store.opened(db, writable=True) as store:  # large values freed, then their pages taken one by one
        failures = store.dbs["failures"]
        store.write(lambda txn: [txn.put(b"%d" % i, noise(10_000, i), db=failures) for i in range(20)])
        store.write(lambda txn: txn.drop(failures, delete=False))
        for i in range(12):
            size = int(np.random.default_rng(i).integers(100, 3000))
            store.write(lambda txn: txn.put(b"n%d" % i, noise(size, i), db=failures))
            check = verify_gallery(db)  # pages that held a large value's middle are free, not damaged
            assert check["ok"], (i, check)


@pytest.mark.parametrize("item_id", [-1, 1 << 64, 10**30, 128])
def test_an_id_no_item_has_is_no_item_and_never_damage(gallery, tmp_path, caplog, capsys, item_id) -> None:
    caplog.set_level(logging.DEBUG)
    with Gallery.open(gallery["db"]) as g:
        for read in (g.item, g.thumbnail):
            with pytest.raises(KeyError, match=f"no item {item_id}"):
                read(item_id)
        assert g.item(127)["id"] == 127  # the gallery is fine
    db = tmp_path / "g"
    shutil.copytree(gallery["db"], db)
    assert main(["index", "remove", "--db", str(db), "--ids", "5", str(item_id)]) == 2
    assert f"no item with id {item_id} in {db}; nothing removed" in one_line(capsys.readouterr().err)
    assert "damaged" not in caplog.text
    assert verify_gallery(db)["count"] == 128


def test_a_job_that_changes_a_damaged_gallery_says_so_in_one_line(gallery, tmp_path) -> None:
    db = damaged_copy(gallery, tmp_path, "zeroed page 5")  # LMDB aborts on this page (SIGABRT) when it reads it
    done = cli("index", "rebuild", "--db", str(db), timeout=HANG_S)
    assert done.returncode == 2 and "data.mdb is damaged" in one_line(done.stderr), done.stderr


def test_an_unchanged_file_is_walked_once_and_damage_written_since_is_still_found(gallery, tmp_path) -> None:
    db = tmp_path / "g"
    shutil.copytree(gallery["db"], db)
    marker, data = db / LMDB_DIR / WALKED, db / LMDB_DIR / "data.mdb"
    marker.unlink(missing_ok=True)
    Gallery.open(db).close()
    state = json.loads(marker.read_text())
    assert state["size"] == data.stat().st_size and state["mtime_ns"] == data.stat().st_mtime_ns
    assert state["inode"] == data.stat().st_ino and state["txnid"] > 0
    raw = data.read_bytes()
    data.write_bytes(DAMAGE["zeroed page 5"](raw, {**lmdb_layout(raw), **gallery}))  # in place: the same inode
    code, _, err = run(["-c", "import sys\nfrom metricsearch.index import Gallery\nGallery.open(sys.argv[1])", str(db)])
    assert code == 1 and f"{data} is damaged" in err.strip().splitlines()[-1], err[-2000:]
    assert json.loads(marker.read_text()) == state  # a failed walk leaves the marker of the whole file it had
