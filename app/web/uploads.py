"""The page's own upload folder, and the one check that lets a query file in: uploaded there, a regular file."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

#: Gradio names its upload folder by this variable, read when a server is made and on every upload check
GRADIO_TEMP_DIR = "GRADIO_TEMP_DIR"

_lock = threading.Lock()
_users = 0
_folder: Path | None = None
_previous: str | None = None


def open_upload_folder() -> Path:
    """A fresh private folder that Gradio uploads into while this process serves, instead of the
    machine-wide /tmp/gradio; the servers of one process share it (Gradio checks uploads against one folder)."""
    global _users, _folder, _previous
    with _lock:
        if _folder is None:
            _folder = Path(tempfile.mkdtemp(prefix="metricsearch-uploads-")).resolve()
            _previous = os.environ.get(GRADIO_TEMP_DIR)
            os.environ[GRADIO_TEMP_DIR] = str(_folder)
        _users += 1
        return _folder


def close_upload_folder() -> None:
    """Undo one `open_upload_folder`: the last server to close deletes the folder and restores the variable."""
    global _users, _folder, _previous
    with _lock:
        _users -= 1
        if _users > 0 or _folder is None:
            return
        shutil.rmtree(_folder, ignore_errors=True)
        if _previous is None:
            os.environ.pop(GRADIO_TEMP_DIR, None)
        else:
            os.environ[GRADIO_TEMP_DIR] = _previous
        _folder, _previous = None, None


def uploaded_file(path: str | os.PathLike, folder: Path) -> Path | None:
    """`path` resolved, if it is a regular file inside `folder` (resolved); else None. Nothing is opened:
    a FIFO, a device, a directory or a link out of the folder is refused without touching its contents."""
    try:
        real = Path(os.path.realpath(path))
        inside = os.path.commonpath([real, folder]) == str(folder)
        return real if inside and stat.S_ISREG(os.lstat(real).st_mode) else None
    except (OSError, ValueError):  # no such file, a NUL byte in the name, paths on different drives
        return None
