"""Locks of a gallery: a readers-writer lock for threads of one process, and the writer lock file
that lets one job at a time change a gallery folder."""

from __future__ import annotations

import fcntl
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

LOCK_FILE = "write.lock"
_OPEN_LOCK = threading.Lock()


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


_LOCKS: dict[str, list] = {}


@contextmanager
def job_lock(db: Path) -> Iterator[None]:
    """Hold the gallery's writer lock (DIR/write.lock): one job that changes a gallery at a time.
    Re-entrant within a process; the system drops it when the process dies, even by SIGKILL."""
    db = Path(db)
    db.mkdir(parents=True, exist_ok=True)
    key = str((db / LOCK_FILE).resolve())
    with _OPEN_LOCK:
        entry = _LOCKS.get(key)
        if entry is None:
            fd = os.open(key, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
                os.close(fd)
                raise ValueError(f"{db} is being changed by another job (pid {holder}); wait for it to finish") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            entry = _LOCKS[key] = [fd, 0]
        entry[1] += 1
    try:
        yield
    finally:
        with _OPEN_LOCK:
            entry[1] -= 1
            if entry[1] == 0:
                fcntl.flock(entry[0], fcntl.LOCK_UN)
                os.close(entry[0])
                del _LOCKS[key]
