"""Locks of a gallery: a readers-writer lock for threads of one process, the writer lock file
that lets one job at a time change a gallery folder, and `OPEN`, the one process-wide table of
shared handles (LMDB environments, writer lock files) behind one lock."""

from __future__ import annotations

import fcntl
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

LOCK_FILE = "write.lock"
T = TypeVar("T")


class RWLock:
    """Many readers or one writer; a waiting writer goes before new readers. The read side is a
    plain mutex in the common case (no writer): it sits on every search."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._readers = 0
        self._writer = False
        self._waiting = 0

    def acquire_read(self) -> None:
        self._mutex.acquire()
        try:
            while self._writer or self._waiting:
                self._cond.wait()
            self._readers += 1
        finally:
            self._mutex.release()

    def release_read(self) -> None:
        self._mutex.acquire()
        self._readers -= 1
        if not self._readers and self._waiting:
            self._cond.notify_all()
        self._mutex.release()

    @contextmanager
    def writing(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class SharedHandles:
    """Process-wide handles that must be opened once per process (an LMDB environment, a lock file),
    keyed by resolved path and counted by user; the last user's release closes the handle."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._table: dict[str, list] = {}

    def acquire(self, key: str, make: Callable[[], T], check: Callable[[T], None] = lambda handle: None) -> T:
        """The open handle of `key` (`check`ed) or a new one from `make()`; one more user either way."""
        with self._lock:
            entry = self._table.get(key)
            if entry is None:
                entry = self._table[key] = [make(), 0]
            else:
                check(entry[0])
            entry[1] += 1
            return entry[0]

    def release(self, key: str, handle: object, close: Callable[[T], None]) -> None:
        """One user less of `handle`; `close(handle)` when it was the last (nothing if `key` holds another)."""
        with self._lock:
            entry = self._table.get(key)
            if entry is None or entry[0] is not handle:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del self._table[key]
                close(handle)


OPEN = SharedHandles()


def _lock_file(db: Path, path: str) -> int:
    """The writer lock file, opened and locked (ValueError naming the holder's pid when another process has it)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise ValueError(f"{db} is being changed by another job (pid {holder}); wait for it to finish") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _unlock_file(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


@contextmanager
def job_lock(db: Path) -> Iterator[None]:
    """Hold the gallery's writer lock (DIR/write.lock): one job that changes a gallery at a time.
    Re-entrant within a process; the system drops it when the process dies, even by SIGKILL."""
    db = Path(db)
    db.mkdir(parents=True, exist_ok=True)
    key = str((db / LOCK_FILE).resolve())
    fd = OPEN.acquire(key, lambda: _lock_file(db, key))
    try:
        yield
    finally:
        OPEN.release(key, fd, _unlock_file)
