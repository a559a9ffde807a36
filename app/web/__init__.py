"""The visual search web page (Gradio): `serve(db, ...)` opens a gallery once and serves the page.

    from metricsearch.app.web import serve
    serve("gallery/", port=7860)                # blocks; http://127.0.0.1:7860/

The page's handlers are plain methods of `SearchHandlers` over an open gallery; `build_page`
lays them out. Neither imports torch nor metricsearch.train.
"""

from metricsearch.app.web.handlers import DEFAULT_QUERY_MAX_PIXELS, SearchHandlers
from metricsearch.app.web.page import Server, build_page, parse_auth, serve

__all__ = ["DEFAULT_QUERY_MAX_PIXELS", "SearchHandlers", "Server", "build_page", "parse_auth", "serve"]
