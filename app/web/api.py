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
from typing import Any

import anyio
import gradio as gr
from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from metricsearch.app.web.handlers import ALL_LABELS, SearchHandlers

#: images at most in one batch request
MAX_BATCH_IMAGES = 16
#: room in a request's body for the form's other fields and multipart headers, in bytes
FORM_OVERHEAD = 64 * 1024

_FORM = {"type": "object", "properties": {
    "k": {"type": "integer", "default": 10, "description": "neighbours to return"},
    "label": {"type": "string", "default": ALL_LABELS, "description": "keep only items with this label"}}}


def _form_schema(field: str, many: bool) -> dict[str, Any]:
    """The OpenAPI request body of a search route: a multipart form with an image file (or several) in `field`."""
    file = {"type": "string", "format": "binary"}
    schema = {**_FORM, "required": [field],
              "properties": {field: {"type": "array", "items": file} if many else file, **_FORM["properties"]}}
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}}


def mount_api(app: FastAPI, handlers: SearchHandlers, *, max_upload_bytes: int, concurrency: int = 4,
              max_images: int = MAX_BATCH_IMAGES) -> None:
    """Add the /api/ routes to the page's running app (`app.auth`: Gradio's users, or None for an open page).

    At most `concurrency` requests decode and search at once; bodies over what `max_images` files of
    `max_upload_bytes` each need are refused before they are read."""
    limiter = anyio.CapacityLimiter(concurrency)

    def authorised(request: Request) -> None:
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

    async def files_of(request: Request, field: str, most: int) -> tuple[list[tuple[str, bytes]], Any, Any]:
        """(name, bytes) of the form's files in `field`, and its k and label; HTTPException saying what is wrong."""
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
            out = []
            for file in files:
                name = file.filename or "upload"
                data = await file.read(max_upload_bytes + 1)
                if len(data) > max_upload_bytes:
                    raise HTTPException(413, f"Cannot search with this file. {name} is over the upload limit of "
                                             f"{max_upload_bytes / 2**20:g} MB.")
                out.append((name, data))
            return out, form.get("k", 10), form.get("label", ALL_LABELS)
        finally:
            await form.close()  # its spooled files

    def search(images: list[tuple[str, bytes]], k: Any, label: Any) -> list[dict[str, Any]]:
        """One {name, hits} or {name, error} per image: a refused image never fails the others."""
        answers: list[dict[str, Any]] = []
        queries = []
        for name, data in images:
            try:
                queries.append(handlers.query(data, k, label, name))
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

    router = APIRouter(prefix="/api", tags=["metricsearch"])

    @router.post("/search", openapi_extra=_form_schema("image", many=False))
    async def search_one(request: Request) -> dict[str, Any]:
        """The k nearest gallery items of one image, nearest first: id, cosine score, label, thumbnail URL."""
        authorised(request)
        images, k, label = await files_of(request, "image", 1)
        answer = (await anyio.to_thread.run_sync(search, images[:1], k, label, limiter=limiter))[0]
        if "error" in answer:
            raise HTTPException(400, answer["error"])
        return {"hits": with_urls(request, answer["hits"])}

    @router.post("/search/batch", openapi_extra=_form_schema("images", many=True))
    async def search_batch(request: Request) -> dict[str, Any]:
        """The k nearest items of each of several images (form field `images`, repeated), in order; an image
        that cannot be searched gets an `error` (the page's one-line refusal) instead of `hits`."""
        authorised(request)
        images, k, label = await files_of(request, "images", max_images)
        answers = await anyio.to_thread.run_sync(search, images, k, label, limiter=limiter)
        return {"results": [{**a, "hits": with_urls(request, a["hits"])} if "hits" in a else a for a in answers]}

    @router.get("/items/{item_id}")
    def item(item_id: int, request: Request) -> dict[str, Any]:
        """An item's id, label and thumbnail URL (never its source path)."""
        authorised(request)
        try:
            label = handlers.gallery.item(item_id)["label"]
        except KeyError:
            raise HTTPException(404, f"No item {item_id} in this gallery.") from None
        return with_urls(request, [{"id": item_id, "label": label}])[0]

    @router.get("/items/{item_id}/thumbnail", response_class=FileResponse)
    def thumbnail(item_id: int, request: Request) -> FileResponse:
        """An item's stored thumbnail (JPEG or PNG; a grey square when the gallery keeps none)."""
        authorised(request)
        try:
            return FileResponse(handlers.thumbnail(item_id))
        except KeyError:
            raise HTTPException(404, f"No item {item_id} in this gallery.") from None

    @router.get("/info")
    def info(request: Request) -> dict[str, Any]:
        """The gallery (model file name, dimension, items, labels, index) and the limits of a query."""
        authorised(request)
        return {**handlers.public_info(), "label_names": handlers.labels, "max_k": handlers.max_k,
                "max_pixels": handlers.max_pixels, "min_side": handlers.min_side,
                "max_upload_bytes": max_upload_bytes, "max_batch_images": max_images}

    @router.get("/openapi.json", include_in_schema=False)
    def openapi(request: Request) -> dict[str, Any]:
        authorised(request)
        return schema

    schema = get_openapi(title="metricsearch JSON API", version="1", routes=router.routes,
                         description=__doc__.split("\n\n")[0])
    app.include_router(router)
