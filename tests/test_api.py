"""The JSON API under /api/ on a real server on 127.0.0.1 (the page's own): searches one image and a batch,
items, info and the OpenAPI schema; the page's limits and refusals; --auth with Basic credentials, the
login cookie and the login throttle; and the README's curl and requests examples, run as written."""

from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from metricsearch.app.web import serve
from metricsearch.index import Gallery

from test_readme import REPO, readme_block

TIMEOUT = 120  # a bound for a hung request, never a measure of speed
pytestmark = pytest.mark.timeout(900)


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def _search(url: str, data: bytes, name: str = "query.png", **form) -> httpx.Response:
    return httpx.post(url + "api/search", files={"image": (name, data, "image/png")}, data=form, timeout=TIMEOUT)


def test_search_returns_the_hits_of_the_gallery_nearest_first(server, digits_gallery: Path, gallery_items) -> None:
    item_id, label, image = gallery_items[0]
    answer = _search(server.url, _png(image), k=5)
    assert answer.status_code == 200, answer.text
    hits = answer.json()["hits"]
    with Gallery.open(digits_gallery) as gallery:
        expected = gallery.search(image, 5)[0]
    assert [h["id"] for h in hits] == [int(i) for i in expected.ids] and hits[0]["id"] == item_id
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    assert hits[0]["thumbnail"] == f"/api/items/{item_id}/thumbnail"
    other = next(lab for _, lab, _ in gallery_items if lab != label)
    filtered = _search(server.url, _png(image), k=3, label=other).json()["hits"]
    assert len(filtered) == 3 and {h["label"] for h in filtered} == {other}
    thumb = httpx.get(server.url + hits[0]["thumbnail"].lstrip("/"), timeout=TIMEOUT)
    assert thumb.status_code == 200 and Image.open(io.BytesIO(thumb.content)).size == image.size


def test_a_batch_shares_one_inference_call_and_a_bad_image_fails_only_itself(server, gallery_items) -> None:
    good = [(f"q{i}.png", _png(image)) for i, (_, _, image) in enumerate(gallery_items[:5])]
    bad = [("7x7.png", _png(Image.new("RGB", (7, 7)))), ("text.png", b"not an image")]
    files = [("images", (name, data, "image/png")) for name, data in good[:3] + bad + good[3:]]
    answer = httpx.post(server.url + "api/search/batch", files=files, data={"k": 2}, timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["name"] for r in results] == [name for name, _ in good[:3] + bad + good[3:]]
    firsts = [r["hits"][0]["id"] for r in results if "hits" in r]
    assert firsts == [item_id for item_id, _, _ in gallery_items[:5]]
    assert results[3]["error"].startswith("Cannot search with this file. 7x7.png: 7x7 is smaller than 8 px")
    assert results[4]["error"].startswith("Cannot search with this file. text.png: not")
    assert server.handlers._search.batch_sizes[-1] == 5  # the five good images: one call


def test_api_and_page_queries_at_once_all_get_their_own_hits(server, gallery_items, tmp_path: Path) -> None:
    from gradio_client import Client, handle_file

    # a gradio client per page query, as each browser is its own (and as test_ui's eight clients): jobs running at once
    # on one shared Client share its one SSE stream, and one failed with CancelledError when it closed under them
    paths = []
    for i, (_, _, image) in enumerate(gallery_items):
        paths.append(tmp_path / f"q{i}.png")
        image.save(paths[-1])

    def one(i: int) -> int:
        item = i % len(gallery_items)
        if i % 2:
            client = Client(server.url, verbose=False, download_files=False, ssl_verify=False)
            return client.predict(handle_file(str(paths[item])), 3, api_name="/search")[1][0]["id"]
        return _search(server.url, _png(gallery_items[item][2]), k=3).json()["hits"][0]["id"]

    before = len(server.handlers._search.batch_sizes)
    with ThreadPoolExecutor(8) as pool:
        firsts = list(pool.map(one, range(16)))
    assert firsts == [gallery_items[i % len(gallery_items)][0] for i in range(16)]
    assert sum(server.handlers._search.batch_sizes[before:]) == 16  # every query went through the one coalescer


@pytest.mark.parametrize("case, status, message", [
    ("k=0", 400, "k must be between 1 and 50, got 0"),
    ("k=x", 400, "k must be a whole number, got 'x'"),
    ("label", 400, "no label 'nope' in this gallery"),
    ("tiny", 400, "Cannot search with this file. tiny.png: 3x900 is smaller than 8 px"),
    ("pixels", 400, "Cannot search with this file. pixels.png: 6000x5000 = 30000000 pixels is over the limit"),
    ("no file", 400, "No image to search: send the image file as the form field 'image'."),
    ("body over the limit", 413, "over the limit of"),
    ("file over the limit", 413, "Cannot search with this file. big.png is over the upload limit of 1 MB."),
    ("chunked", 411, "Send the request's Content-Length"),
])
def test_the_page_limits_hold_with_one_line_refusals(server, gallery_items, case: str, status: int,
                                                     message: str) -> None:
    good = _png(gallery_items[0][2])
    big = np.random.default_rng(0).integers(0, 256, (700, 700, 3), dtype=np.uint8)  # about 1.5 MB as PNG
    if case.startswith("k=") or case == "label":
        form = {"k": case[2:]} if case != "label" else {"label": "nope"}
        answer = _search(server.url, good, **form)
    elif case in ("tiny", "pixels"):
        image = Image.new("P", (3, 900)) if case == "tiny" else Image.new("L", (6000, 5000))
        answer = _search(server.url, _png(image), f"{case}.png")
    elif case == "no file":
        answer = httpx.post(server.url + "api/search", files={"other": ("a.png", good)}, timeout=TIMEOUT)
    elif case == "body over the limit":
        answer = _search(server.url, _png(Image.fromarray(big)), "big.png")
    elif case == "file over the limit":  # a batch's body may be larger, each file may not
        files = [("images", ("q.png", good)), ("images", ("big.png", _png(Image.fromarray(big))))]
        answer = httpx.post(server.url + "api/search/batch", files=files, timeout=TIMEOUT)
    else:
        answer = httpx.post(server.url + "api/search", content=iter([b"--x\r\n"]), timeout=TIMEOUT,
                            headers={"content-type": "multipart/form-data; boundary=x"})
    assert answer.status_code == status, answer.text
    detail = answer.json()["detail"]
    assert message in detail and "\n" not in detail, detail


def test_items_and_info_never_show_a_server_path(server, digits_gallery: Path, gallery_items) -> None:
    item_id, label, _ = gallery_items[1]
    with Gallery.open(digits_gallery) as gallery:
        path, count = gallery.item(item_id)["path"], len(gallery.catalog.ids)
    answer = httpx.get(f"{server.url}api/items/{item_id}", timeout=TIMEOUT)
    assert answer.json() == {"id": item_id, "label": label, "thumbnail": f"/api/items/{item_id}/thumbnail"}
    assert httpx.get(f"{server.url}api/items/999999", timeout=TIMEOUT).status_code == 404
    assert httpx.get(f"{server.url}api/items/999999/thumbnail", timeout=TIMEOUT).status_code == 404
    info = httpx.get(server.url + "api/info", timeout=TIMEOUT).json()
    assert (info["count"] == count and info["model"].endswith(".onnx") and "/" not in info["model"]
            and info["max_k"] == 50)
    assert info["max_upload_bytes"] == 1024 * 1024 and info["min_side"] == 8 and label in info["label_names"]
    text = json.dumps(info) + answer.text
    assert str(digits_gallery) not in text and Path(path).name not in text
    schema = httpx.get(server.url + "api/openapi.json", timeout=TIMEOUT).json()
    assert {"/api/search", "/api/search/batch", "/api/items/{item_id}", "/api/info"} <= set(schema["paths"])
    body = schema["paths"]["/api/search"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert body["required"] == ["image"] and {"k", "label"} <= set(body["properties"])


def test_auth_protects_every_route_and_failed_credentials_are_throttled(digits_gallery: Path, free_port: int,
                                                                        gallery_items) -> None:
    guarded = serve(digits_gallery, port=free_port, auth=[("ann", "right")], block=False, log=lambda _: None,
                    login_failures=3, login_pause=1.0)
    other_address = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=TIMEOUT)
    item_id = gallery_items[0][0]
    try:
        url = guarded.url
        routes = [("GET", "api/info"), ("GET", f"api/items/{item_id}"), ("GET", f"api/items/{item_id}/thumbnail"),
                  ("GET", "api/openapi.json")]
        for method, route in routes:
            assert httpx.request(method, url + route, timeout=TIMEOUT).status_code == 401, route
        # FastAPI's root schema (Gradio's app) would answer without a login: it is gone, with or without one
        assert httpx.get(url + "openapi.json", timeout=TIMEOUT).status_code == 404
        assert httpx.get(url + "openapi.json", auth=("ann", "right"), timeout=TIMEOUT).status_code == 404
        files = {"image": ("q.png", _png(gallery_items[0][2]))}
        assert httpx.post(url + "api/search", files=files, timeout=TIMEOUT).status_code == 401
        assert httpx.post(url + "api/search/batch", files=[("images", files["image"])],
                          timeout=TIMEOUT).status_code == 401
        answer = httpx.post(url + "api/search", files=files, auth=("ann", "right"), timeout=TIMEOUT)
        assert answer.status_code == 200 and answer.json()["hits"][0]["id"] == item_id
        with httpx.Client(timeout=TIMEOUT) as browser:  # the page's login cookie opens the API too
            assert browser.post(url + "login", data={"username": "ann", "password": "right"}).status_code == 200
            assert browser.get(url + "api/info").status_code == 200

        def info(auth, client=httpx) -> int:
            return client.get(url + "api/info", auth=auth, timeout=TIMEOUT).status_code

        assert [info(("ann", "wrong")) for _ in range(3)] == [401, 401, 401]
        assert info(("ann", "right")) == 429  # refused without checking, as a page login would be
        assert httpx.post(url + "login", data={"username": "ann", "password": "right"},
                          timeout=TIMEOUT).status_code == 429  # the page's login shares the count
        assert info(("ann", "right"), other_address) == 200
    finally:
        other_address.close()
        guarded.close()


def test_readme_curl_and_requests_examples_run(server, gallery_items, tmp_path: Path) -> None:
    section = (REPO / "README.md").read_text().split("### JSON API\n", 1)[1]
    curl = re.search(r"```bash\n(.*?)\n", section).group(1)
    gallery_items[0][2].save(tmp_path / "query.png")
    gallery_items[1][2].save(tmp_path / "query2.png")
    done = subprocess.run(shlex.split(curl.replace("http://127.0.0.1:7860/", server.url)), cwd=tmp_path,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    hits = json.loads(done.stdout)["hits"]
    assert len(hits) == 5 and hits[0]["id"] == gallery_items[0][0]
    code = readme_block("JSON API")
    done = subprocess.run([sys.executable, "-c", code.replace("http://127.0.0.1:7860/", server.url)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == str([gallery_items[0][0], gallery_items[1][0]])
