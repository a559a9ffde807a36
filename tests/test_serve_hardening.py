"""The search server as issue 86 found it open, on real servers on 127.0.0.1: the login throttle that other
answers reset, what an anonymous visitor of an `--auth` server learns of the gallery, server paths in Gradio's
answers, a directory sent as a query file, the JSON API before it is mounted, ids out of range, and
`serve` values that overflowed, hung or were accepted."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from PIL import Image

from metricsearch.app.web import serve
from metricsearch.index import build_gallery

from conftest import _free_port
from test_serve_safety import TIMEOUT, Served, _png, _private

pytestmark = pytest.mark.timeout(900)

#: labels that appear nowhere on a page unless the gallery's labels are shown
LABELS = ("zanzibar-teapot", "quokka-lantern")


@pytest.fixture(scope="module")
def labelled_gallery(digits_onnx: Path, gallery_items, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small gallery with labels that no page shows by chance (the digits thumbnails, two classes)."""
    root = tmp_path_factory.mktemp("labelled")
    for n, (_, _, image) in enumerate(gallery_items):
        folder = root / "images" / LABELS[n % 2]
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"{n}.png")
    build_gallery(digits_onnx, f"folder:{root / 'images'}", root / "gallery")
    return root / "gallery"


def test_only_a_success_clears_the_failed_logins_whatever_comes_between(digits_gallery: Path) -> None:
    guarded = serve(digits_gallery, port=_free_port(), auth=[("ann", "right")], block=False, log=lambda _: None,
                    login_pause=300)  # no pause runs out during the test
    try:
        url = guarded.url
        # answers that judge no credentials: a route that does not exist, a doubled slash (with a guess or
        # without), a bad id (without; with a guess it is a failed login: the login comes before the arguments)
        between = [("api/nope", ("ann", "x")), ("api//info", ("ann", "y")), ("api/items/abc", None),
                   ("api/nope", None)]
        answers, others = [], []
        for n in range(40):
            answers.append(httpx.get(url + "api/info", auth=("ann", f"guess{n}"), timeout=TIMEOUT).status_code)
            route, auth = between[n % len(between)]
            others.append(httpx.get(url + route, auth=auth, timeout=TIMEOUT).status_code)
        assert answers[:5] == [401] * 5 and set(answers[5:]) == {429}, answers
        assert set(others) <= {401, 404, 429} and 404 in others, others
        # the login comes before the arguments: a bad id with wrong credentials is a failed login, not a 422
        assert httpx.get(url + "api/items/abc", auth=("ann", "x"), timeout=TIMEOUT).status_code in (401, 429)
    finally:
        guarded.close()


def test_an_anonymous_visitor_learns_nothing_of_the_gallery(labelled_gallery: Path) -> None:
    guarded = serve(labelled_gallery, port=_free_port(), auth=[("ann", "right")], block=False, log=lambda _: None)
    try:
        url = guarded.url
        pages = {route: httpx.get(url + route, timeout=TIMEOUT).text for route in (
            "", "config", "gradio_api/info", "gradio_api/info?all_endpoints=true", "api/info", "api/openapi.json",
            "openapi.json", "docs", "manifest.json")}
        secrets = [*LABELS, str(labelled_gallery), "model.onnx", "metricsearch-uploads-"]
        for route, text in pages.items():
            assert not [s for s in secrets if s in text], (route, text[:2000])
        with httpx.Client(timeout=TIMEOUT) as browser:  # after the login the API tells the labels
            assert browser.post(url + "login", data={"username": "ann", "password": "right"}).status_code == 200
            assert set(browser.get(url + "api/info").json()["label_names"]) == set(LABELS)
    finally:
        guarded.close()


def test_no_server_path_in_answers_and_a_directory_query_never_breaks_the_shutdown(digits_gallery: Path, good_query,
                                                                                    tmp_path: Path) -> None:
    server = Served(digits_gallery, tmp_path / "server.log")
    try:
        public = server.upload(good_query[0], f"{uuid.uuid4().hex}.png")  # its name finds its folder
        private = str(_private(public).parent.parent)
        event, data = server.call({"path": public, "meta": {"_type": "gradio.FileData"}})
        assert event == "complete" and '"path": "uploads/' in data and private not in data, data
        thumbnail = data.split('"url": "', 1)[1].split('"', 1)[0]  # the page loads results from these URLs
        assert httpx.get(thumbnail, timeout=TIMEOUT).content[:4] == b"\x89PNG"
        assert private not in httpx.get(server.url, timeout=TIMEOUT).text + httpx.get(server.url + "config").text
        for folder in ("uploads", public.rsplit("/", 1)[0], private, os.path.dirname(private + "/x")):
            assert server.call({"path": folder, "meta": {"_type": "gradio.FileData"}})[0] == "error", folder
    finally:
        server.close()
    log = server.log.read_text()
    assert server.process.returncode == 0 and "Traceback" not in log and "shutdown failed" not in log, log
    assert not Path(private).exists()


def test_the_api_answers_from_the_first_request_the_page_answers(digits_gallery: Path, tmp_path: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    process = subprocess.Popen([sys.executable, "-m", "metricsearch", "serve", "--db", str(digits_gallery),
                                "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        seen = []
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and len(seen) < 20:
            try:
                page = httpx.get(url, timeout=TIMEOUT).status_code
            except httpx.TransportError:
                continue
            seen.append((page, httpx.get(url + "api/info", timeout=TIMEOUT).status_code))
        assert seen and all(api == 200 for _, api in seen), seen
    finally:
        process.terminate()
        process.wait(TIMEOUT)


@pytest.mark.parametrize("item", ["-1", "18446744073709551616", "1000000000000000000000000000000",
                                  str(2**63 - 1), str(2**63)])
def test_ids_out_of_range_are_no_item_and_no_damage(served, item: str) -> None:
    start = served.log.stat().st_size
    for route in (f"api/items/{item}", f"api/items/{item}/thumbnail"):
        answer = httpx.get(served.url + route, timeout=TIMEOUT)
        assert answer.status_code == 404 and answer.json()["detail"] == f"No item {item} in this gallery.", answer
    with served.log.open() as log:
        log.seek(start)
        assert "damaged" not in log.read()


@pytest.mark.parametrize("args, message", [
    (["--max-upload-mb", "1e308"], "--max-upload-mb must be a positive number of at most 1024, got 1e+308"),
    (["--max-megapixels", "1e300"], "--max-megapixels must be a positive number of at most 100, got 1e+300"),
    (["--concurrency", "1000000000000"], "--concurrency must be a positive number of at most 64, got 1000000000000"),
    (["--auth-file", "FIFO"], "is not a regular file: pass a text file of USER:PASS lines"),
    (["--auth-file", "DIR"], "is not a regular file: pass a text file of USER:PASS lines"),
    (["--auth-file", "BIG"], "bytes, over 1048576: pass a file of USER:PASS lines"),
])
def test_serve_values_that_overflowed_hung_or_passed_exit_2_naming_the_option(digits_gallery: Path, tmp_path: Path,
                                                                             args, message) -> None:
    if args[1] == "FIFO":
        os.mkfifo(tmp_path / "fifo")  # opened for reading, it would wait for a writer for ever
    (tmp_path / "big").write_bytes(b"ann:right\n" * 200_000)
    args = [{"FIFO": str(tmp_path / "fifo"), "DIR": str(tmp_path), "BIG": str(tmp_path / "big")}.get(a, a)
            for a in args]
    done = subprocess.run([sys.executable, "-m", "metricsearch", "serve", "--db", str(digits_gallery), "--port",
                           str(_free_port()), *args], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("metricsearch serve: error: "), done.stderr
    assert message in done.stderr and args[0] in done.stderr, done.stderr


@pytest.fixture(scope="module")
def served(digits_gallery: Path, tmp_path_factory: pytest.TempPathFactory):
    server = Served(digits_gallery, tmp_path_factory.mktemp("served") / "server.log")
    yield server
    server.close()


@pytest.fixture(scope="module")
def good_query(gallery_items) -> tuple[bytes, int]:
    """A gallery item's thumbnail as PNG bytes, and its id."""
    item_id, _, image = gallery_items[0]
    return _png(image.resize((56, 56), Image.BILINEAR)), item_id
