"""The search page's layout (Gradio Blocks) and `serve`, which opens a gallery once and serves the page."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import ipaddress
import math
import os
import signal
import socket
import stat
import threading
from collections.abc import Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr
from PIL import Image

from fastapi.middleware import Middleware

from metricsearch.app.web.api import api_routes
from metricsearch.app.web.handlers import (
    ALL_LABELS, CLASS_COLUMNS, DEFAULT_QUERY_MAX_PIXELS, EVALUATE_ITEMS, SearchHandlers)
from metricsearch.app.web.throttle import LOGIN_FAILURES, LOGIN_PAUSE, MAX_PAUSE, LoginThrottle
from metricsearch.app.web.uploads import UploadPaths, close_upload_folder, open_upload_folder

#: system fonts only: the page makes no request to any other site
THEME = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
CSS = "#results img { image-rendering: pixelated; }"


def build_page(handlers: SearchHandlers, *, concurrency: int = 4, default_k: int = 10,
               examples: Sequence[Image.Image] = ()) -> gr.Blocks:
    """The page's Blocks: a Search tab (query editor: upload, paste, webcam, crop; k, label filter, results,
    about panel) and, for a labelled gallery, an Evaluate tab (its worst queries and per-class table).

    Events: the Search button and an upload search; a click on a result searches with it; the
    named API endpoint `/search` takes one image (and optional k and label) and returns the
    thumbnails and the hits as JSON. All share one concurrency limit. What the page says of the gallery
    (labels, about panel, Evaluate tab) comes with its load event, which needs the login: the page's
    layout and API schema, which Gradio serves to anyone, hold nothing of it.
    """
    # analytics off: offline and private, no calls home (and no version check)
    with gr.Blocks(title="metricsearch", delete_cache=(3600, 3600), analytics_enabled=False) as page:
        gr.Markdown("## metricsearch: visual search\nGive an image; crop it to search for a part. "
                    "Click a result to search with it.")
        with gr.Tab("Search"):
            with gr.Row():
                with gr.Column(scale=2):
                    query = gr.ImageEditor(
                        label="query (upload, paste or webcam)", sources=("upload", "clipboard", "webcam"),
                        type="filepath", image_mode="RGB", format="png", transforms=("crop",), brush=False,
                        eraser=False, layers=False, height=360, elem_id="query")
                    k = gr.Slider(1, handlers.max_k, value=min(default_k, handlers.max_k), step=1, label="k")
                    label = gr.Dropdown([("all labels", ALL_LABELS)], value=ALL_LABELS, label="label filter",
                                        elem_id="label")
                    button = gr.Button("Search", variant="primary", elem_id="search")
                    if examples:
                        gr.Examples([[image] for image in examples], inputs=[query], label="example queries")
                with gr.Column(scale=3):
                    results = gr.Gallery(label="most similar", columns=4, height="auto", object_fit="contain",
                                         allow_preview=False, elem_id="results")
                    with gr.Accordion("About this gallery", open=False):
                        about = gr.Markdown(elem_id="about")
                    with gr.Accordion("hits as JSON", open=False):
                        hits = gr.JSON(label="hits", elem_id="hits")
        with gr.Tab("Evaluate", visible=False) as evaluate_tab:  # a labelled gallery: where its own model fails
            gr.Markdown(f"Each labelled item (at most {EVALUATE_ITEMS:,}) queries all the others: the queries "
                        "whose first correct hit ranks lowest (wrong labels framed red, the first correct green), "
                        "and Recall@1 and MAP@R per class, worst first.")
            evaluate = gr.Button("Evaluate this gallery", elem_id="evaluate")
            worst = gr.Image(label="worst queries", type="pil", interactive=False, elem_id="worst")
            classes = gr.Dataframe(headers=list(CLASS_COLUMNS), label="classes, worst first",
                                   interactive=False, elem_id="classes")
        evaluate.click(handlers.evaluation, outputs=[worst, classes], concurrency_limit=1,
                       api_name="evaluate", api_visibility="private")
        page.load(lambda: (gr.Dropdown(choices=[("all labels", ALL_LABELS)] + [(x, x) for x in handlers.labels]),
                           handlers.about(), gr.Tab(visible=len(handlers.labels) >= 2)),
                  outputs=[label, about, evaluate_tab], api_name="gallery", api_visibility="private")
        api_image = gr.Image(type="filepath", image_mode=None, visible=False)
        api_trigger = gr.Button(visible=False)

        shared: dict[str, Any] = {"concurrency_limit": concurrency, "concurrency_id": "search",
                                  "preprocess": False}
        gr.on([button.click, query.upload], handlers.search, inputs=[query, k, label], outputs=[results, hits],
              api_name="page_search", api_visibility="private", **shared)
        results.select(handlers.search_id, inputs=[hits, k, label], outputs=[query, results, hits],
                       api_name="result_search", api_visibility="private", **shared)
        api_trigger.click(handlers.search, inputs=[api_image, k, label], outputs=[results, hits],
                          api_name="search", api_description="One image in; the k most similar gallery "
                          "items out: thumbnails with captions, and a JSON list of id, score, label.", **shared)
    return page


def parse_auth(auth: str | None = None, auth_file: str | Path | None = None) -> list[tuple[str, str]] | None:
    """The (user, password) pairs of `USER:PASS` and/or a file of such lines (# comments), or None for no auth."""
    entries = [("--auth", auth)] if auth else []
    if auth_file:
        lines = _small_text_file(auth_file, "--auth-file").splitlines()
        entries += [(f"{auth_file}:{n}", line.strip()) for n, line in enumerate(lines, 1)
                    if line.strip() and not line.lstrip().startswith("#")]
        if not entries:
            raise ValueError(f"{auth_file} has no USER:PASS line")
    pairs = []
    for where, text in entries:
        user, sep, password = text.partition(":")
        if not sep or not user.strip() or not password:
            raise ValueError(f"{where}: expected USER:PASS with neither part empty")
        pairs.append((user.strip(), password))
    return pairs or None


#: the largest --auth-file read, in bytes
MAX_AUTH_FILE = 1 << 20


def _small_text_file(path: str | Path, option: str) -> str:
    """The text of a regular file of at most MAX_AUTH_FILE bytes; ValueError naming `option` for anything else
    (a FIFO or a device would block or never end: nothing is opened until the path is known to be a file)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise ValueError(f"{option} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{option} {path} is not a regular file: pass a text file of USER:PASS lines")
    if info.st_size > MAX_AUTH_FILE:
        raise ValueError(f"{option} {path} is {info.st_size} bytes, over {MAX_AUTH_FILE}: pass a file of "
                         "USER:PASS lines")
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{option} {path} is not UTF-8 text: pass a text file of USER:PASS lines") from None


@dataclass
class Server:
    """A running page: its URL, and `close()` to stop it."""

    url: str
    page: gr.Blocks
    handlers: SearchHandlers
    resources: ExitStack = field(default_factory=ExitStack, repr=False)

    def close(self) -> None:
        """Stop the server, delete its thumbnail files and its upload folder, and give the process back
        its faiss thread count and glibc's default mmap threshold (the gallery stays open)."""
        self.page.close()
        self.handlers.close()
        close_upload_folder()
        self.resources.close()


def _check_address(host: str, port: int) -> None:
    """ValueError or OSError, in one line, unless a server could listen on `host`:`port` now."""
    if not 1 <= port <= 65535:
        raise ValueError(f"--port must be between 1 and 65535, got {port}")
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        except (socket.gaierror, UnicodeError):
            raise ValueError(f"--host {host} is not an address or a known host name") from None
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise OSError(f"port {port} on {host} is taken (another server?): pass another --port") from None
            raise OSError(f"cannot listen on {host}:{port} ({exc.strerror or exc}): pass an address of "
                          "this machine as --host") from None


#: the largest values `serve` accepts: an upload of 1 GB, 64 searches at once, 100-megapixel queries (about 700 MB
#: each while an RGBA one decodes)
MAX_UPLOAD_MB, MAX_CONCURRENCY, MAX_MEGAPIXELS = 1024, 64, 100


def serve(db: str | Path, host: str = "127.0.0.1", port: int = 7860, *, auth: list[tuple[str, str]] | None = None,
          max_upload_mb: float = 10, concurrency: int = 4, max_pixels: float = DEFAULT_QUERY_MAX_PIXELS,
          examples: Sequence[Image.Image] = (), block: bool = True, log: Callable[[str], None] = print,
          login_failures: int = LOGIN_FAILURES, login_pause: float = LOGIN_PAUSE) -> Server:
    """Open the gallery in `db` once and serve the search page on http://HOST:PORT/, and its JSON API
    under /api/ (api.py), until Ctrl-C.

    Binds 127.0.0.1 unless `host` says otherwise; `auth` is a list of (user, password); uploads
    over `max_upload_mb` or `max_pixels` are refused; `concurrency` searches run at once (those
    that arrive together share an inference call). No file path is ever served: thumbnails come
    from the gallery's LMDB, and queries are read only from the server's own upload folder (deleted
    at exit). After `login_failures` failed logins from one address, its attempts wait out a pause
    of `login_pause` seconds, doubled by each further failure. Bad arguments, an address it cannot
    listen on, or a gallery whose model does not load: ValueError or OSError before anything starts.
    With `block=False` it returns the running Server at once.
    """
    for name, value, least, most in (
            ("--max-upload-mb", max_upload_mb, 1e-6, MAX_UPLOAD_MB), ("--concurrency", concurrency, 1, MAX_CONCURRENCY),
            ("--max-megapixels", max_pixels / 1e6, 1e-6, MAX_MEGAPIXELS), ("login failures", login_failures, 1, 1e6),
            ("login pause", login_pause, 1e-3, MAX_PAUSE)):
        if not (math.isfinite(value) and least <= value <= most):
            shown = value if isinstance(value, int) else format(value, "g")
            raise ValueError(f"{name} must be a positive number of at most {most:g}, got {shown}")
    _check_address(host, port)
    from metricsearch.index import Gallery, search_threads

    process = ExitStack()  # the process-wide settings of serving, each restored when the server closes
    process.enter_context(search_threads(1))  # one OpenMP thread per search: requests run side by side
    process.enter_context(_large_buffers_returned_to_the_system())
    process.enter_context(_environment_kept("HF_HUB_DISABLE_TELEMETRY"))  # gr.Blocks sets it (analytics off)
    gallery = Gallery.open(db)
    try:
        gallery.embedder  # noqa: B018 -- the model loads now, or the command stops now
    except BaseException:
        gallery.close()
        process.close()
        raise
    uploads, handlers = open_upload_folder(), None
    try:
        handlers = SearchHandlers(gallery, max_pixels=int(max_pixels), uploads=uploads)
        page = build_page(handlers, concurrency=concurrency, examples=examples)
        page.queue(max_size=64 * concurrency)
        max_upload_bytes = int(max_upload_mb * 1024 * 1024)
        # the JSON API is part of the app from its first request; FastAPI's root /openapi.json is not (it would
        # answer without a login: Gradio guards only its own routes; /api/openapi.json is behind `--auth`)
        _, url, _ = page.launch(
            server_name=host, server_port=port, auth=auth, max_file_size=max_upload_bytes,
            prevent_thread_lock=True, quiet=True, show_error=False, ssr_mode=False, footer_links=["api"],
            theme=THEME, css=CSS, app_kwargs={
                "middleware": [Middleware(LoginThrottle, failures=login_failures, pause=login_pause),
                               Middleware(UploadPaths, folder=uploads)],
                "routes": api_routes(handlers, max_upload_bytes=max_upload_bytes, concurrency=concurrency),
                "openapi_url": None})
    except BaseException as exc:
        if handlers is not None:
            handlers.close()
        gallery.close()
        close_upload_folder()
        process.close()
        if isinstance(exc, OSError) and "Cannot find empty port" in str(exc):
            raise OSError(f"port {port} on {host} is taken (another server?): pass another --port") from None
        raise
    server = Server(url, page, handlers, process)
    count = len(handlers.gallery)
    serving = f"serving {count} image{'' if count == 1 else 's'} from {db} on {url} (Ctrl-C stops)"
    if not block:
        log(serving)
        return server
    try:
        with _sigterm_interrupts():
            log(serving)
            page.block_thread()  # until Ctrl-C (or SIGTERM)
    finally:
        server.close()
    return server


#: glibc's mallopt option M_MMAP_THRESHOLD, and its default value
M_MMAP_THRESHOLD, GLIBC_MMAP_THRESHOLD = -3, 128 * 1024


@contextmanager
def _large_buffers_returned_to_the_system(threshold: int = 1 << 20) -> Iterator[None]:
    """For the block, glibc maps every buffer over `threshold` bytes on its own, so that a large query's pixels
    go back to the system when freed (by default glibc raises that threshold as it goes and keeps such
    buffers in per-thread arenas: the server kept the peak of its largest queries for good). After, glibc's
    default threshold is set again: glibc cannot say the value in force before, nor resume adjusting it."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc: its own allocator's policy stands
        yield
        return
    mallopt(M_MMAP_THRESHOLD, threshold)
    try:
        yield
    finally:
        mallopt(M_MMAP_THRESHOLD, GLIBC_MMAP_THRESHOLD)


@contextmanager
def _environment_kept(*names: str) -> Iterator[None]:
    """For the block, these environment variables may change; after, each has its value from before (or none)."""
    before = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops the server as Ctrl-C does, for the block; the previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
