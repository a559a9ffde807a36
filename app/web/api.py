"""The JSON API beside the search page: plain FastAPI routes on the page's own server, under /api/.

    POST /api/search        multipart: image (a file), k, label  -> {"hits": [{id, score, label, thumbnail}]}
    POST /api/search/batch  multipart: images (several files), k, label -> {"results": [{name, hits | error}]}
    GET  /api/items/{id}    -> {id, label, thumbnail}       (never the item's source path)
    GET  /api/items/{id}/thumbnail                          -> the stored thumbnail's bytes
    GET  /api/info          -> the gallery (as the page's about panel shows it) and the limits below
    GET  /api/openapi.json  -> the OpenAPI schema of these routes

The page's limits hold (upload size, pixels, smallest side, k) with the page's one-line refusals, and its
queries share inference calls with the page's (`SearchHandlers.hits`). With `--auth`, every route needs the
page's login cookie or HTTP Basic credentials, and failed credentials count as failed logins (throttle.py).
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, BinaryIO

import anyio
import gradio as gr
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute

from metricsearch.app.web.handlers import ALL_LABELS, SearchHandlers

#: images at most in one batch request
MAX_BATCH_IMAGES = 16
#: room in a request's body for the form's other fields and multipart headers, in bytes
FORM_OVERHEAD = 64 * 1024
#: ids are 8-byte unsigned LMDB keys below this (the largest an int64 faiss id holds); others name no item
ID_LIMIT = 2**63

_FORM = {"type": "object", "properties": {
    "k": {"type": "integer", "default": 10, "description": "neighbours to return"},
    "label": {"type": "string", "default": ALL_LABELS, "description": "keep only items with this label"}}}


def _form_schema(field: str, many: bool) -> dict[str, Any]:
    """The OpenAPI request body of a search route: a multipart form with an image file (or several) in `field`."""
    file = {"type": "string", "format": "binary"}
    schema = {**_FORM, "required": [field],
              "properties": {field: {"type": "array", "items": file} if many else file, **_FORM["properties"]}}
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}}


def api_routes(handlers: SearchHandlers, *, max_upload_bytes: int, concurrency: int = 4,
               max_images: int = MAX_BATCH_IMAGES) -> list[BaseRoute]:
    """The /api/ routes, for the page's app to hold from its first request (`request.app.auth`: Gradio's users,
    or None for an open page); each checks the login before it reads its arguments.

    At most `concurrency` requests decode and search at once; bodies over what `max_images` files of
    `max_upload_bytes` each need are refused before they are read."""
    limiter = anyio.CapacityLimiter(concurrency)

    def authorised(request: Request) -> None:
        app = request.app
        users = getattr(app, "auth", None)
        if users is None:
            return
        cookie = (request.cookies.get(f"access-token-{app.cookie_id}")
                  or request.cookies.get(f"access-token-unsecure-{app.cookie_id}"))
        if cookie and app.tokens.get(cookie) is not None:
            return
        scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
        try:
            user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            user, password = "", ""
        if scheme.lower() == "basic" and user in users and hmac.compare_digest(
                password.encode(), str(users[user]).encode()):
            return
        raise HTTPException(401, "Log in: send HTTP Basic credentials (curl -u USER:PASS) or the page's login "
                                 "cookie.", headers={"WWW-Authenticate": 'Basic realm="metricsearch"'})

    @asynccontextmanager
    async def files_of(request: Request, field: str, most: int
                       ) -> AsyncIterator[tuple[list[tuple[str, BinaryIO]], Any, Any]]:
        """(name, file) of the form's files in `field` (spooled, open for the block), and its k and label;
        HTTPException saying what is wrong."""
        length = request.headers.get("content-length")
        if length is None or not length.isdigit():
            raise HTTPException(411, "Send the request's Content-Length (a multipart form with the image).")
        limit = most * max_upload_bytes + FORM_OVERHEAD
        if int(length) > limit:
            raise HTTPException(413, f"The request is {int(length)} bytes, over the limit of {limit} bytes "
                                     f"({most} image(s) of at most {max_upload_bytes / 2**20:g} MB).")
        try:
            form = await request.form(max_files=most, max_fields=10)
        except StarletteHTTPException as exc:
            raise HTTPException(400, f"Send a multipart form: {exc.detail}") from None
        try:
            files = [f for f in form.getlist(field) if isinstance(f, UploadFile)]
            if not files:
                raise HTTPException(400, f"No image to search: send the image file as the form field {field!r}.")
            for file in files:
                if file.size > max_upload_bytes:  # counted by starlette as it spooled the file
                    raise HTTPException(413, f"Cannot search with this file. {file.filename or 'upload'} is over "
                                             f"the upload limit of {max_upload_bytes / 2**20:g} MB.")
            yield [(f.filename or "upload", f.file) for f in files], form.get("k", 10), form.get("label", ALL_LABELS)
        finally:
            await form.close()  # its spooled files

    def search(images: list[tuple[str, BinaryIO]], k: Any, label: Any) -> list[dict[str, Any]]:
        """One {name, hits} or {name, error} per image: a refused image never fails the others. The files are
        read one at a time, each kept only as its query (resized to the model's input)."""
        answers: list[dict[str, Any]] = []
        queries = []
        for name, file in images:
            try:
                queries.append(handlers.query(file.read(), k, label, name))
                answers.append({"name": name})
            except gr.Error as exc:
                answers.append({"name": name, "error": exc.message})
        found = iter(handlers.hits(queries))
        for answer in answers:
            if "error" not in answer:
                answer["hits"] = next(found)
        return answers

    def with_urls(request: Request, hits: list[dict[str, Any]]) -> list[dict[str, Any]]:
        root = request.scope.get("root_path", "")
        return [{**hit, "thumbnail": f"{root}/api/items/{hit['id']}/thumbnail"} for hit in hits]

    def stored(item_id: int) -> int:
        """`item_id` if it can name an item at all; else 404 as for any id that is not in the gallery."""
        if not 0 <= item_id < ID_LIMIT:
            raise HTTPException(404, f"No item {item_id} in this gallery.")
        return item_id

    router = APIRouter(prefix="/api", tags=["metricsearch"], dependencies=[Depends(authorised)])

    @router.post("/search", openapi_extra=_form_schema("image", many=False))
    async def search_one(request: Request) -> dict[str, Any]:
        """The k nearest gallery items of one image, nearest first: id, cosine score, label, thumbnail URL."""
        async with files_of(request, "image", 1) as (images, k, label):
            answer = (await anyio.to_thread.run_sync(search, images[:1], k, label, limiter=limiter))[0]
        if "error" in answer:
            raise HTTPException(400, answer["error"])
        return {"hits": with_urls(request, answer["hits"])}

    @router.post("/search/batch", openapi_extra=_form_schema("images", many=True))
    async def search_batch(request: Request) -> dict[str, Any]:
        """The k nearest items of each of several images (form field `images`, repeated), in order; an image
        that cannot be searched gets an `error` (the page's one-line refusal) instead of `hits`."""
        async with files_of(request, "images", max_images) as (images, k, label):
            answers = await anyio.to_thread.run_sync(search, images, k, label, limiter=limiter)
        return {"results": [{**a, "hits": with_urls(request, a["hits"])} if "hits" in a else a for a in answers]}

    @router.get("/items/{item_id}")
    def item(item_id: int, request: Request) -> dict[str, Any]:
        """An item's id, label and thumbnail URL (never its source path)."""
        try:
            label = handlers.gallery.item(stored(item_id))["label"]
        except KeyError:
            raise HTTPException(404, f"No item {item_id} in this gallery.") from None
        return with_urls(request, [{"id": item_id, "label": label}])[0]

    @router.get("/items/{item_id}/thumbnail", response_class=FileResponse)
    def thumbnail(item_id: int, request: Request) -> FileResponse:
        """An item's stored thumbnail (JPEG or PNG; a grey square when the gallery keeps none)."""
        try:
            return FileResponse(handlers.thumbnail(stored(item_id)))
        except KeyError:
            raise HTTPException(404, f"No item {item_id} in this gallery.") from None

    @router.get("/info")
    def info() -> dict[str, Any]:
        """The gallery (model file name, dimension, items, labels, index) and the limits of a query."""
        return {**handlers.public_info(), "label_names": handlers.labels, "max_k": handlers.max_k,
                "max_pixels": handlers.max_pixels, "min_side": handlers.min_side,
                "max_upload_bytes": max_upload_bytes, "max_batch_images": max_images}

    @router.get("/openapi.json", include_in_schema=False)
    def openapi() -> dict[str, Any]:
        return schema

    schema = get_openapi(title="metricsearch JSON API", version="1", routes=router.routes,
                         description=__doc__.split("\n\n")[0])
    return router.routes
