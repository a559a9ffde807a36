"""The gallery's LMDB store and its on-disk layout: named databases, keys and records, batched writes that
grow the map by themselves, read-only readers, and the change log that keeps the faiss index recoverable.

One environment per gallery (`DIR/gallery.lmdb`), with the named databases

    metadata    format version, model, settings, index description, job, state; counters
                `version` (one more per committed write), `next_id`, `generation`
    items       id -> ItemRecord (sha256, byte size, label, source path)
    thumbnails  id -> JPEG or PNG bytes, about 256 px on the long side
    embeddings  id -> float32 vector (L2-normalised)
    hashes      sha256 -> id (exact duplicates are stored once)
    sources     source path -> id (indexed items and the duplicates that map onto them)
    failures    source path -> reason (the current job's unreadable images)
    log         version -> added or removed ids: replayed onto an older faiss file
    tombstones  id -> b"": removed ids still inside an index faiss cannot remove from (HNSW)
    checksums   id -> CRC-32 of the item's record, vector and thumbnail (galleries written before it have none)

Ids are 8-byte big-endian keys, so cursors walk them in numeric order; they are never reused.

Before LMDB maps the file, `Store` checks it (`check_file`, then `walk_once`): a damaged file is one
DamagedGallery naming it, never a crash of the process (LMDB aborts or faults on some damaged pages).
"""

from __future__ import annotations

import json
import signal
import struct
import subprocess
import sys
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import lmdb
import numpy as np

from .build_steps import reached
from .lmdb_walk import DAMAGED
from .locks import OPEN, RWLock

LMDB_DIR = "gallery.lmdb"
FORMAT_VERSION = 1
DB_NAMES = ("metadata", "items", "thumbnails", "embeddings", "hashes", "sources", "failures", "log", "tombstones",
            "checksums")
OPTIONAL_DBS = ("checksums",)  # absent from galleries written before it; made by the first writable open
INITIAL_MAP_SIZE = 1 << 30
ADD, REMOVE = b"A", b"R"
COUNTERS = ("version", "next_id", "generation")
R = TypeVar("R")
_RECORD = struct.Struct("<32sqH")
_CHECKSUMS = struct.Struct("<III")
# LMDB 0.9's file on a 64-bit machine. A page starts with a 16-byte header: page number (8 bytes), pad, flags,
# lower, upper (2 each). Pages 0 and 1 then hold a meta: magic, version (4 each), address, map size (8 each), the
# free list's and the main table's MDB_db (48 bytes each: pad (which keeps the page size in the free list's),
# flags, depth, then branch, leaf and overflow page counts, entries and the root page, 8 bytes each), the last page
# in use and the transaction id (8 each). _META reads flags, magic, version, page size, the free list's root, the
# main table's root, the last page and the transaction id.
_PAGE = struct.Struct("<QHH")
_META = struct.Struct("<10xH4xII16xI36xQ40xQQQ")
_MAGIC, _DATA_VERSION, _P_BRANCH, _P_LEAF, _P_META, _P_INVALID = 0xBEEFC0DE, 1, 0x01, 0x02, 0x08, (1 << 64) - 1
WALKED = "walked.json"  # in the LMDB folder: the file's state when a walk last found it whole (`walk_once`)
WALK_TIMEOUT_S = 60, 60  # the child's walk may take this many seconds, plus this many per GB of the file


def id_key(item_id: int) -> bytes:
    """The LMDB key of an id (8 bytes, big-endian: keys sort as numbers)."""
    return struct.pack(">Q", item_id)


def key_id(key: bytes) -> int:
    """The id an LMDB key holds."""
    return struct.unpack(">Q", key)[0]


def checksums(record: bytes, vector: bytes, thumbnail: bytes) -> bytes:
    """What `checksums` keeps of an item: the CRC-32 of its record, its vector and its thumbnail (12 bytes)."""
    return _CHECKSUMS.pack(zlib.crc32(record), zlib.crc32(vector), zlib.crc32(thumbnail))


def mismatches(stored: bytes, record: bytes, vector: bytes, thumbnail: bytes) -> list[str]:
    """Which of an item's record, vector and thumbnail no longer match the checksums stored with it."""
    now = _CHECKSUMS.unpack(checksums(record, vector, thumbnail))
    kept = _CHECKSUMS.unpack(stored) if len(stored) == _CHECKSUMS.size else (None,) * 3
    return [part for part, a, b in zip(("record", "vector", "thumbnail"), kept, now) if a != b]


@dataclass(frozen=True)
class ItemRecord:
    """What the gallery keeps about one indexed image."""

    path: str
    label: str | None
    sha256: bytes
    size: int

    def encode(self) -> bytes:
        """Compact bytes: sha256, size, label length, label, path (UTF-8)."""
        label = (self.label or "").encode()
        return _RECORD.pack(self.sha256, self.size, len(label)) + label + self.path.encode()

    @classmethod
    def decode(cls, data: bytes) -> ItemRecord:
        """Inverse of `encode`."""
        sha, size, n = _RECORD.unpack_from(data)
        label = bytes(data[_RECORD.size:_RECORD.size + n]).decode()
        return cls(bytes(data[_RECORD.size + n:]).decode(), label or None, sha, size)


class NotCreated(FileNotFoundError):
    """The gallery's LMDB file exists, its named databases do not (a build stopped before creating them)."""


class DamagedGallery(OSError):
    """The gallery's LMDB file cannot be read: damaged pages or records that do not decode."""


def damaged(data: Path, how: str) -> DamagedGallery:
    """The one-line error of a damaged LMDB file `data`: it `how` (e.g. "is damaged: ..."), and what to do."""
    return DamagedGallery(f"{data} {how}: restore the gallery folder from a backup, or build it again with "
                          "`metricsearch index build --overwrite`")


@contextmanager
def reporting_damage(db: Path) -> Iterator[None]:
    """Turn LMDB's errors and records that do not decode into one DamagedGallery naming the file."""
    try:
        yield
    except (lmdb.Error, struct.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        if isinstance(exc, (lmdb.MapFullError, lmdb.ReadonlyError)):
            raise
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise damaged(Path(db) / LMDB_DIR / "data.mdb", f"is damaged or unreadable ({detail})") from exc


def check_file(data: Path) -> int:
    """DamagedGallery unless LMDB's file `data` is whole as far as its first pages tell, read with plain reads
    before LMDB maps it (a page past the end of a cut file is SIGBUS when read through the map): both meta pages
    (flag, magic, version, page size), a size that holds every page up to the newer meta's last page, and the
    root pages of the main table and the free list in place. Reads 4 pages, whatever the file's size. Returns the
    newer meta page's transaction id."""
    size = data.stat().st_size
    with open(data, "rb") as f:
        metas = []
        for page in (0, 1):
            f.seek(page * metas[0][3] if metas else 0)
            raw = f.read(_META.size)
            if len(raw) < _META.size:
                raise damaged(data, f"is damaged: it is {size} bytes, too short for LMDB's two meta pages")
            flags, magic, version, psize, *_ = meta = _META.unpack(raw)
            if not (flags & _P_META and magic == _MAGIC and version == _DATA_VERSION
                    and 512 <= psize <= 65536 and not psize & (psize - 1)):
                raise damaged(data, f"is damaged: page {page} is not an LMDB meta page (flag, magic, version or "
                                    "page size)")
            metas.append(meta)
        *_, psize, free_root, main_root, last, txnid = max(metas, key=lambda m: m[-1])  # the newer, as LMDB reads
        if size < (last + 1) * psize:
            raise damaged(data, f"is damaged: it is cut short, {size} bytes where LMDB's meta page says "
                                f"{last + 1} pages of {psize} bytes ({(last + 1) * psize} bytes)")
        for what, root in (("free list", free_root), ("main table", main_root)):
            if root == _P_INVALID:  # an empty table
                continue
            f.seek(min(root, last) * psize)
            number, _, flags = _PAGE.unpack(f.read(_PAGE.size))
            if root > last or number != root or not flags & (_P_BRANCH | _P_LEAF):
                raise damaged(data, f"is damaged: the root page {root} of its {what} is not a B-tree page")
    return txnid


def _file_state(data: Path, txnid: int) -> dict[str, int]:
    """What tells that LMDB's file is the one an earlier walk read: its size, change time, inode and transaction."""
    st = data.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino, "txnid": txnid}


def walk_once(path: Path, txnid: int) -> None:
    """`walk_in_child`, unless the file is unchanged since a walk found it whole (`WALKED`: its size, change time,
    inode and transaction id): a 10M-item gallery's 24 GB are read once after each change, not at every open.
    Damage done since by a write changes the file's time; the CRC-32 checksums (`index verify`) find the rest."""
    data, marker = path / "data.mdb", path / WALKED
    state = _file_state(data, txnid)
    try:
        if json.loads(marker.read_text()) == state:
            return
    except (OSError, ValueError):
        pass
    walk_in_child(path)
    try:  # read-only media: walk at every open
        marker.write_text(json.dumps(state))
    except OSError:
        pass


def walk_in_child(path: Path) -> None:
    """DamagedGallery when LMDB, reading every key and value of the gallery's tables in a child process
    (`lmdb_walk.py`), reports damage or dies of it. Costs a Python start (about 15 ms) and a walk of every record
    (on 2 busy cores: 0.25-0.45 s for 1.1 GB of 50,000 items with 20 KB thumbnails, 0.8-1.3 s for 300,000 items
    without; opening a gallery decodes its items' records anyway, 2 s for those 300,000)."""
    data = path / "data.mdb"
    timeout = WALK_TIMEOUT_S[0] + WALK_TIMEOUT_S[1] * data.stat().st_size / 1e9
    site = str(Path(lmdb.__file__).resolve().parents[1])  # -S: no site start-up (half the child's time)
    try:
        done = subprocess.run([sys.executable, "-I", "-S", str(Path(__file__).with_name("lmdb_walk.py")), site,
                               str(path), *DB_NAMES], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise OSError(f"reading {data} through took over {timeout:.0f} s (a damaged file, or a very slow disk): "
                      "run the command again, or `metricsearch index verify`") from None
    said = done.stdout.splitlines()[-1:] or ["main"]  # the table it walked last, or LMDB's error
    if done.returncode == DAMAGED:
        raise damaged(data, f"is damaged or unreadable ({said[0]})")
    if -done.returncode in (signal.SIGBUS, signal.SIGSEGV, signal.SIGABRT, signal.SIGILL, signal.SIGFPE):
        raise damaged(data, f"is damaged: LMDB fails on it ({signal.Signals(-done.returncode).name} reading its "
                            f"{said[0]} table)")
    if done.returncode:
        err = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise OSError(f"could not check {data} before opening it ({err})")


class Store:
    """One gallery's LMDB environment, shared by everything in this process that opens it.

    LMDB must not be opened twice by one process, so `Store.open` hands out the open one. `lock`
    guards what needs no other transaction in the process (growing the map) and, for the
    gallery, the in-memory faiss index: readers hold it shared, changes exclusively.
    """

    def __init__(self, path: Path, writable: bool) -> None:
        self.path, self.writable = path, writable
        data = path / "data.mdb"
        if data.is_file() and (data.stat().st_size or not writable):  # LMDB starts an empty file afresh
            walk_once(path, check_file(data))
        with reporting_damage(path.parent):
            self.env = lmdb.open(str(path), max_dbs=len(DB_NAMES) + 2, readonly=not writable,
                                 map_size=INITIAL_MAP_SIZE, readahead=False)
            try:
                self.dbs = {}
                if writable:  # all of them in one transaction: none or all exist, even after SIGKILL
                    with self.env.begin(write=True) as txn:
                        for name in DB_NAMES:
                            self.dbs[name] = self.env.open_db(name.encode(), txn=txn)
                            reached("databases")
                else:  # a handle opened in a read transaction would not outlive it
                    for name in DB_NAMES:
                        try:
                            self.dbs[name] = self.env.open_db(name.encode(), create=False)
                        except lmdb.NotFoundError:
                            if name not in OPTIONAL_DBS:
                                raise
            except lmdb.NotFoundError:
                self.env.close()
                raise NotCreated(f"{path.parent} is not a gallery: its build stopped before it created its "
                                 "databases; run `metricsearch index build` again") from None
        self.lock = RWLock()

    @classmethod
    def open(cls, folder: Path, writable: bool = False) -> Store:
        """The store of gallery folder `folder` (created when `writable` and absent)."""
        path = Path(folder) / LMDB_DIR
        if not writable and not (path / "data.mdb").is_file():
            raise FileNotFoundError(f"{folder} is not a gallery (no {LMDB_DIR}): "
                                    "make one with `metricsearch index build`")
        key = str(path.resolve())

        def check(store: Store) -> None:
            if writable and not store.writable:
                raise ValueError(f"{folder} is open read-only in this process: close that Gallery before changing it")

        def make() -> Store:
            path.mkdir(parents=True, exist_ok=True)
            return cls(path, writable)

        return OPEN.acquire(key, make, check)

    @classmethod
    @contextmanager
    def opened(cls, folder: Path, writable: bool = False) -> Iterator[Store]:
        """`Store.open` for the block, closed after it."""
        store = cls.open(folder, writable)
        try:
            yield store
        finally:
            store.close()

    def close(self) -> None:
        """Give this user's handle back; the environment closes with its last user."""
        OPEN.release(str(self.path.resolve()), self, lambda store: store.env.close())

    # --- transactions ---------------------------------------------------------------------------

    def begin(self) -> lmdb.Transaction:
        """A read transaction; the caller holds `lock` for reading (a resized map is adopted first)."""
        try:
            return self.env.begin()
        except lmdb.MapResizedError:
            self.lock.release_read()
            try:
                with self.lock.writing():
                    self.env.set_mapsize(0)
            finally:
                self.lock.acquire_read()
            return self.env.begin()

    @contextmanager
    def read(self) -> Iterator[lmdb.Transaction]:
        """A read transaction under the shared lock."""
        self.lock.acquire_read()
        try:
            with reporting_damage(self.path.parent), self.begin() as txn:
                yield txn
        finally:
            self.lock.release_read()

    def write(self, fn: Callable[[lmdb.Transaction], R]) -> R:
        """fn(txn) in one write transaction, committed; run again on a map twice as large when full."""
        if not self.writable:
            raise ValueError(f"{self.path.parent} was opened read-only")
        while True:
            txn = self.env.begin(write=True)
            try:
                with reporting_damage(self.path.parent):
                    result = fn(txn)
                    txn.commit()
                return result
            except lmdb.MapFullError:
                txn.abort()
                with self.lock.writing():
                    self.env.set_mapsize(self.env.info()["map_size"] * 2)
            except BaseException:
                txn.abort()
                raise

    # --- metadata -------------------------------------------------------------------------------

    def meta(self, txn: lmdb.Transaction, key: str, default: Any = None) -> Any:
        """A JSON metadata value (or a counter), `default` when absent."""
        raw = txn.get(key.encode(), db=self.dbs["metadata"])
        if raw is None:
            return default
        return int.from_bytes(raw, "big") if key in COUNTERS else json.loads(raw)

    def put_meta(self, txn: lmdb.Transaction, key: str, value: Any) -> None:
        """Set a JSON metadata value (or a counter)."""
        raw = value.to_bytes(8, "big") if key in COUNTERS else json.dumps(value, sort_keys=True).encode()
        txn.put(key.encode(), raw, db=self.dbs["metadata"])

    def version(self, txn: lmdb.Transaction) -> int:
        """The number of committed writes."""
        raw = txn.get(b"version", db=self.dbs["metadata"])
        return int.from_bytes(raw, "big") if raw else 0

    # --- items and vectors ----------------------------------------------------------------------

    def item(self, txn: lmdb.Transaction, item_id: int) -> ItemRecord | None:
        """The record of an id, None when absent."""
        raw = txn.get(id_key(item_id), db=self.dbs["items"])
        return None if raw is None else ItemRecord.decode(raw)

    def records(self, txn: lmdb.Transaction, ids: np.ndarray | None = None) -> Iterator[tuple[int, ItemRecord]]:
        """(id, record) of `ids`, or of every item in id order."""
        if ids is not None:
            for i in ids:
                yield int(i), self.item(txn, int(i))
            return
        for key, raw in txn.cursor(db=self.dbs["items"]):
            yield key_id(key), ItemRecord.decode(raw)

    def vectors(self, txn: lmdb.Transaction, ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, N x dim float32 embeddings) of `ids`, or of every item in id order; one copy in memory."""
        db, dim = self.dbs["embeddings"], int(self.meta(txn, "model", {}).get("dim", 0))
        if ids is None:
            n = self.count(txn, "embeddings")
            ids, out = np.empty(n, np.int64), np.empty((n, dim), np.float32)
            for row, (key, value) in enumerate(txn.cursor(db=db)):
                ids[row], out[row] = key_id(key), np.frombuffer(value, np.float32)
            return ids, out
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty((len(ids), dim), np.float32)
        for row, i in enumerate(ids):
            out[row] = np.frombuffer(txn.get(id_key(int(i)), db=db), np.float32)
        return ids, out

    def ids(self, txn: lmdb.Transaction, db: str) -> np.ndarray:
        """The ids that are keys of named database `db`, in order."""
        return np.array([key_id(k) for k in txn.cursor(db=self.dbs[db]).iternext(values=False)], dtype=np.int64)

    def count(self, txn: lmdb.Transaction, db: str = "items") -> int:
        """Entries of a named database."""
        return int(txn.stat(self.dbs[db])["entries"])

    # --- change log -----------------------------------------------------------------------------

    def append_log(self, txn: lmdb.Transaction, version: int, op: bytes, ids: np.ndarray) -> None:
        """Record that write `version` added (ADD) or removed (REMOVE) `ids`."""
        txn.put(id_key(version), op + np.asarray(ids, dtype="<i8").tobytes(), db=self.dbs["log"])

    def log_since(self, txn: lmdb.Transaction, after: int, upto: int) -> list[tuple[bytes, np.ndarray]] | None:
        """The changes of writes after..upto, in order (a write that changed no item has none);
        None when the log was pruned past `after` (load the faiss file again instead)."""
        if after < self.meta(txn, "log_pruned_to", 0):
            return None
        cursor = txn.cursor(db=self.dbs["log"])
        changes = []
        if cursor.set_range(id_key(after + 1)):
            for key, raw in cursor:
                if key_id(key) > upto:
                    break
                changes.append((bytes(raw[:1]), np.frombuffer(raw[1:], dtype="<i8").astype(np.int64)))
        return changes

    def prune_log(self, txn: lmdb.Transaction, upto: int) -> None:
        """Drop the log entries of writes up to `upto` (a faiss file at a later version exists)."""
        cursor = txn.cursor(db=self.dbs["log"])
        while cursor.first() and key_id(cursor.key()) <= upto:
            cursor.delete()
        self.put_meta(txn, "log_pruned_to", max(upto, self.meta(txn, "log_pruned_to", 0)))

    def used_bytes(self) -> int:
        """Bytes of the LMDB file in use (pages up to the last one written)."""
        return (self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"]

