"""The page's own upload folder, and the one check that lets a query file in: uploaded there, a regular file."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

from metricsearch.app.web.json_answer import send_detail

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


#: how the page's upload folder is named to clients: a path relative to it, under this prefix
PUBLIC_PREFIX = "uploads"
#: where a query path that names no file uploaded to this page is sent instead (it never exists)
REFUSED_NAME = ".not-uploaded"
#: the largest JSON request body that is read to translate its file paths, in bytes
MAX_JSON_BODY = 1 << 20
_TRANSLATED = (b"application/json", b"text/event-stream", b"text/html")


class UploadPaths:
    """ASGI middleware: clients never see the upload folder's server path, and Gradio never sees a path that
    is not a regular file uploaded to this page.

    Out, in every JSON, event-stream and HTML answer, the folder's path reads `uploads`; in, the file paths
    of a JSON request (its FileData "path" values) and a `/file=uploads/...` URL are translated back, and a
    path that is not a regular file in the folder (a directory, a FIFO, a file elsewhere) becomes a name
    that does not exist there: the search refuses it in one line, and Gradio never adds it to the files
    it deletes at exit."""

    def __init__(self, app: Callable, folder: Path) -> None:
        self.app, self.folder = app, Path(folder)
        self._private = str(self.folder).encode()

    def private(self, path: str) -> str:
        """A client's path as a server path: an upload's, or a name that does not exist in the folder."""
        if path == PUBLIC_PREFIX or path.startswith(PUBLIC_PREFIX + "/"):
            path = str(self.folder) + path[len(PUBLIC_PREFIX):]
        return str(uploaded_file(path, self.folder) or self.folder / REFUSED_NAME)

    def _paths_translated(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {key: self.private(item) if key == "path" and isinstance(item, str) else
                    self._paths_translated(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self._paths_translated(item) for item in value]
        return value

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        marker = "/file=" + PUBLIC_PREFIX
        if marker in path:  # a file URL that the page made from a translated path
            head, _, tail = path.partition("/file=")
            path = f"{head}/file={self.private(tail)}"
            scope = {**scope, "path": path, "raw_path": path.encode()}
        headers = dict(scope.get("headers", ()))
        if scope.get("method") == "POST" and headers.get(b"content-type", b"").startswith(b"application/json"):
            body, more = b"", True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
                if len(body) > MAX_JSON_BODY:
                    return await send_detail(send, 413, f"A JSON request is at most {MAX_JSON_BODY} bytes.")
            try:
                body = json.dumps(self._paths_translated(json.loads(body))).encode()
            except (ValueError, RecursionError):
                pass  # not JSON: the route says what is wrong with it
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k != b"content-length"]
                     + [(b"content-length", str(len(body)).encode())]}
            receive = _replayed(body, receive)
        translate = False

        async def public(message: dict) -> None:
            nonlocal translate
            if message["type"] == "http.response.start":
                kind = dict(message.get("headers", ())).get(b"content-type", b"")
                translate = kind.startswith(_TRANSLATED)
                if translate:  # the length changes: the server sends the body chunked
                    message = {**message, "headers": [(k, v) for k, v in message.get("headers", ())
                                                      if k != b"content-length"]}
            elif message["type"] == "http.response.body" and translate:
                message = {**message, "body": message.get("body", b"").replace(self._private,
                                                                                PUBLIC_PREFIX.encode())}
            await send(message)

        await self.app(scope, receive, public)


def _replayed(body: bytes, receive: Callable) -> Callable:
    """An ASGI `receive` that gives `body` as the whole request, then what `receive` gives (a disconnect)."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
