"""The search page's layout (Gradio Blocks) and `serve`, which opens a gallery once and serves the page."""

from __future__ import annotations

import signal
import threading
from collections.abc import Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr
from PIL import Image

from metricsearch.app.web.handlers import ALL_LABELS, DEFAULT_QUERY_MAX_PIXELS, SearchHandlers

#: system fonts only: the page makes no request to any other site
THEME = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
CSS = "#results img { image-rendering: pixelated; }"


def build_page(handlers: SearchHandlers, *, concurrency: int = 4, default_k: int = 10,
               examples: Sequence[Image.Image] = ()) -> gr.Blocks:
    """The page's Blocks: query editor (upload, paste, webcam, crop), k, label filter, results, about panel.

    Events: the Search button and an upload search; a click on a result searches with it; the
    named API endpoint `/search` takes one image (and optional k and label) and returns the
    thumbnails and the hits as JSON. All share one concurrency limit.
    """
    labels = [("all labels", ALL_LABELS)] + [(label, label) for label in handlers.labels]
    # analytics off: offline and private, no calls home (and no version check)
    with gr.Blocks(title="metricsearch", delete_cache=(3600, 3600), analytics_enabled=False) as page:
        gr.Markdown("## metricsearch: visual search\nGive an image; crop it to search for a part. "
                    "Click a result to search with it.")
        with gr.Row():
            with gr.Column(scale=2):
                query = gr.ImageEditor(
                    label="query (upload, paste or webcam)", sources=("upload", "clipboard", "webcam"),
                    type="filepath", image_mode="RGB", format="png", transforms=("crop",), brush=False,
                    eraser=False, layers=False, height=360, elem_id="query")
                k = gr.Slider(1, handlers.max_k, value=min(default_k, handlers.max_k), step=1, label="k")
                label = gr.Dropdown(labels, value=ALL_LABELS, label="label filter", elem_id="label")
                button = gr.Button("Search", variant="primary", elem_id="search")
                if examples:
                    gr.Examples([[image] for image in examples], inputs=[query], label="example queries")
            with gr.Column(scale=3):
                results = gr.Gallery(label="most similar", columns=4, height="auto", object_fit="contain",
                                     allow_preview=False, elem_id="results")
                with gr.Accordion("About this gallery", open=False):
                    gr.Markdown(handlers.about(), elem_id="about")
                with gr.Accordion("hits as JSON", open=False):
                    hits = gr.JSON(label="hits", elem_id="hits")
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
        lines = Path(auth_file).read_text(encoding="utf-8").splitlines()
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


@dataclass
class Server:
    """A running page: its URL, and `close()` to stop it."""

    url: str
    page: gr.Blocks
    handlers: SearchHandlers
    resources: ExitStack = field(default_factory=ExitStack, repr=False)

    def close(self) -> None:
        """Stop the server, delete its thumbnail files, close the gallery and give the process back its
        faiss thread count."""
        self.resources.close()


def serve(db: str | Path, host: str = "127.0.0.1", port: int = 7860, *, auth: list[tuple[str, str]] | None = None,
          max_upload_mb: float = 10, concurrency: int = 4, max_pixels: int = DEFAULT_QUERY_MAX_PIXELS,
          examples: Sequence[Image.Image] = (), block: bool = True,
          log: Callable[[str], None] = print) -> Server:
    """Open the gallery in `db` once and serve the search page on http://HOST:PORT/ until Ctrl-C or SIGTERM.

    Binds 127.0.0.1 unless `host` says otherwise; `auth` is a list of (user, password); uploads
    over `max_upload_mb` or `max_pixels` are refused; `concurrency` searches run at once (those
    that arrive together share an inference call). No file path is ever served: thumbnails come
    from the gallery's LMDB. With `block=False` it returns the running Server at once. Closing
    it leaves the process as it was: faiss's thread count and the SIGTERM handler are restored.
    """
    for name, value in (("max upload MB", max_upload_mb), ("concurrency", concurrency), ("max pixels", max_pixels)):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    from metricsearch.index import Gallery, search_threads

    with ExitStack() as stack:
        stack.enter_context(search_threads(1))  # requests run side by side (`concurrency`), one thread each
        gallery = stack.enter_context(Gallery.open(db))
        handlers = SearchHandlers(gallery, max_pixels=max_pixels)
        stack.callback(handlers.close)
        page = build_page(handlers, concurrency=concurrency, examples=examples)
        page.queue(max_size=64 * concurrency)
        try:
            _, url, _ = page.launch(
                server_name=host, server_port=port, auth=auth, max_file_size=int(max_upload_mb * 1024 * 1024),
                prevent_thread_lock=True, quiet=True, show_error=False, ssr_mode=False, footer_links=["api"],
                theme=THEME, css=CSS)
        except OSError as exc:
            if "Cannot find empty port" in str(exc):
                raise OSError(f"port {port} on {host} is taken (another server?): pass another --port") from None
            raise
        stack.callback(page.close)
        server = Server(url, page, handlers, stack.pop_all())
    message = f"serving {gallery.info().get('count', '?')} images from {db} on {url} (Ctrl-C stops)"
    if not block:
        log(message)
        return server
    with server.resources:  # closed (server, thumbnails, gallery, threads) on the way out
        server.resources.enter_context(_sigterm_interrupts())
        log(message)
        page.block_thread()  # until Ctrl-C (or SIGTERM)
    return server


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
