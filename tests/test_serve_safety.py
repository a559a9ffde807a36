"""The search page as an attacker and a careless operator meet it: a real `metricsearch serve` subprocess
on 127.0.0.1, spoken to in raw HTTP (file paths it must not read, FIFOs, tiny and hostile images, many at
once, failed logins), its peak memory read from /proc, and bad `serve` arguments refused before it starts."""

from __future__ import annotations

import glob
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from metricsearch.app.web import serve
from metricsearch.app.web.handlers import NOT_UPLOADED

from conftest import _free_port

TIMEOUT = 120  # a bound for a hung request, never a measure of speed
pytestmark = pytest.mark.timeout(1800)


class Served:
    """A `metricsearch serve` subprocess, its URL and its log; raw-HTTP helpers for the `/search` API."""

    def __init__(self, db: Path, log: Path, *args: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "metricsearch", "serve", "--db", str(db), "--port", str(self.port), *args],
            stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
        line = self.process.stdout.readline()
        assert line.startswith("serving "), (line, log.read_text())

    def upload(self, data: bytes, name: str = "query.png") -> str:
        """The server-side path of a file uploaded as the page uploads it."""
        response = httpx.post(self.url + "gradio_api/upload", files={"files": (name, data, "image/png")},
                              timeout=TIMEOUT)
        response.raise_for_status()
        return response.json()[0]

    def call(self, query, k: int = 5, endpoint: str = "search") -> tuple[str, str]:
        """(event, data) of one call: event is "complete" or "error"."""
        call = httpx.post(f"{self.url}gradio_api/call/{endpoint}", json={"data": [query, k, ""]}, timeout=TIMEOUT)
        call.raise_for_status()
        deadline, event = time.monotonic() + TIMEOUT, ""  # heartbeats would keep a hung call's stream open
        with httpx.stream("GET", f"{self.url}gradio_api/call/{endpoint}/{call.json()['event_id']}",
                          timeout=TIMEOUT) as stream:
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: ") and event in ("complete", "error"):
                    return event, line.removeprefix("data: ")
                if time.monotonic() > deadline:
                    break
        return "no answer", ""

    def search(self, data: bytes, k: int = 5, name: str = "query.png") -> tuple[str, str]:
        """Upload then search, as a client of the API does."""
        path = self.upload(data, name)
        return self.call({"path": path, "orig_name": name, "meta": {"_type": "gradio.FileData"}}, k)

    def status(self, key: str) -> int:
        """A /proc/PID/status value in bytes (VmRSS: resident now; VmHWM: peak since the last reset)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(key)

    def reset_peak(self) -> None:
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(TIMEOUT)
        except subprocess.TimeoutExpired:  # a worker stuck for good (the bug under test) holds it up
            self.process.kill()
            self.process.wait(TIMEOUT)


@pytest.fixture(scope="module")
def served(digits_gallery: Path, tmp_path_factory: pytest.TempPathFactory):
    server = Served(digits_gallery, tmp_path_factory.mktemp("served") / "server.log")
    yield server
    server.close()


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def good_query(gallery_items) -> tuple[bytes, int]:
    """A gallery item's thumbnail, scaled up, as PNG bytes; and the item's id (the first hit)."""
    item_id, _, image = gallery_items[0]
    return _png(image.resize((56, 56), Image.BILINEAR)), item_id


def _hits_first(data: str) -> int:
    import json

    return json.loads(data)[1][0]["id"]


# -- the /search file-read hole ------------------------------------------------------------------

def test_search_reads_only_regular_files_uploaded_to_this_server(served, good_query, tmp_path: Path) -> None:
    outside = tmp_path / "outside.png"
    outside.write_bytes(good_query[0])  # a real image, readable by the server, but never uploaded to it
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)
    uploaded = _private(served.upload(good_query[0], f"{uuid.uuid4().hex}.png"))
    uploads = uploaded.parent.parent  # Gradio puts each upload in a folder of its own under the upload folder
    link = uploaded.parent / "link.png"
    link.symlink_to(outside)
    refused = [str(outside), str(fifo), "/dev/stdin", str(link), str(tmp_path), str(uploads), str(uploaded.parent),
               str(tmp_path / "no-such-file.png"), "/etc/passwd", f"{uploads}/../{outside.name}", "bad\0name.png"]
    # more FIFOs than the server runs searches at once (--concurrency 4): none may hold a worker
    requests = [{"path": path} for path in refused] + [{"path": str(fifo)}] * 8
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(served.call, requests))
    for query, (event, data) in zip(requests, answers):
        assert event == "error" and NOT_UPLOADED in data, (query, data)
    assert len({data for _, data in answers}) == 1  # the same answer, whatever is (or is not) at the path
    editor = [{"background": None, "layers": [], "composite": {"path": path}} for path in refused]
    for query, (event, data) in zip(editor, map(lambda q: served.call(q, endpoint="page_search"), editor)):
        assert event == "error" and str(tmp_path) not in data and "uploads" not in data, (query, data)
    event, data = served.call({"path": str(uploaded), "meta": {"_type": "gradio.FileData"}})
    assert event == "complete" and _hits_first(data) == good_query[1], data


def _private(public: str) -> Path:
    """The server path of an upload that the server names `uploads/...` to its clients (issue 86)."""
    relative = public.removeprefix("uploads/")
    found = [Path(f) for f in glob.glob(os.path.join(tempfile.gettempdir(), "metricsearch-uploads-*"))
             if Path(f, relative).is_file()]
    assert public.startswith("uploads/") and len(found) == 1, (public, found)
    return found[0] / relative


def test_each_server_uploads_into_a_folder_of_its_own_deleted_at_exit(digits_gallery: Path, good_query,
                                                                      tmp_path: Path) -> None:
    server = Served(digits_gallery, tmp_path / "server.log")
    try:
        uploads = _private(server.upload(good_query[0], f"{uuid.uuid4().hex}.png")).parent.parent
        assert uploads.is_dir() and uploads.name.startswith("metricsearch-uploads-")
    finally:
        server.close()
    assert server.process.returncode == 0 and not uploads.exists()


# -- bad queries beside good ones ----------------------------------------------------------------

def test_tiny_and_broken_queries_never_fail_the_good_ones_beside_them(served, good_query) -> None:
    noise = _png(Image.fromarray(np.random.default_rng(0).integers(0, 256, (56, 56), dtype=np.uint8)))
    bad = {"1x1": _png(Image.new("L", (1, 1))), "7x7": _png(Image.new("RGB", (7, 7))),
           "7x7 16-bit": _png(Image.fromarray(np.zeros((7, 7), np.uint16))),
           "3x900 paletted": _png(Image.new("P", (3, 900))), "truncated": noise[:len(noise) // 2]}
    reasons = {"1x1": "1x1 is smaller than 8 px", "7x7": "7x7 is smaller than 8 px",
               "7x7 16-bit": "7x7 is smaller than 8 px", "3x900 paletted": "3x900 is smaller than 8 px",
               "truncated": "not a readable image"}
    start = served.log.stat().st_size
    jobs = [("good", good_query[0]) if i % 2 else (name, bad[name]) for i, name in enumerate(list(bad) * 8)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda job: served.search(job[1], name=f"{job[0]}.png"), jobs))
    for (name, _), (event, data) in zip(jobs, answers):
        if name == "good":
            assert event == "complete" and _hits_first(data) == good_query[1], data
        else:
            assert event == "error" and f"Cannot search with this file. {name}.png: {reasons[name]}" in data, data
    with served.log.open() as log:
        log.seek(start)
        assert "Traceback" not in log.read()


# -- memory per query ----------------------------------------------------------------------------

def test_hostile_16_bit_queries_stay_within_memory_bounds(served, good_query) -> None:
    """A 5000 x 5000 16-bit PNG (about 50 KB, within the default 25-megapixel limit) from one client, then
    from 8 at once: the server's peak resident memory over its idle value, and how far it comes back."""
    hostile = _png(Image.fromarray(np.tile(np.arange(5000, dtype=np.uint16) * 13, (5000, 1))))
    assert len(hostile) < 1024 * 1024
    for _ in range(3):  # warm: every code path has run once
        assert served.search(good_query[0])[0] == "complete"
    assert served.search(hostile)[0] == "complete"
    time.sleep(2)
    idle = served.status("VmRSS")
    served.reset_peak()
    assert served.search(hostile)[0] == "complete"
    one = served.status("VmHWM") - idle
    served.reset_peak()
    with ThreadPoolExecutor(8) as pool:
        assert [event for event, _ in pool.map(lambda _: served.search(hostile), range(8))] == ["complete"] * 8
    eight = served.status("VmHWM") - idle
    after = served.status("VmRSS")
    for _ in range(30):  # memory freed late (threads' arenas) is given time, never asserted on speed
        if after <= 1.2 * idle:
            break
        time.sleep(1)
        after = served.status("VmRSS")
    mb = 1 << 20
    print(f"\nidle {idle / mb:.0f} MB; one hostile query +{one / mb:.0f} MB; 8 at once +{eight / mb:.0f} MB; "
          f"after {after / mb:.0f} MB")
    assert one <= 300 * mb and eight <= 1024 * mb and after <= 1.2 * idle, (idle, one, eight, after)


# -- login throttling ----------------------------------------------------------------------------

def test_failed_logins_from_one_address_are_throttled(digits_gallery: Path, free_port: int) -> None:
    guarded = serve(digits_gallery, port=free_port, auth=[("ann", "right")], block=False, log=lambda _: None,
                    login_failures=3, login_pause=1.0)
    other_address = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=TIMEOUT)
    try:
        def login(password: str, client=httpx) -> int:
            return client.post(guarded.url + "login", data={"username": "ann", "password": password},
                               timeout=TIMEOUT).status_code

        assert [login("wrong") for _ in range(3)] == [400, 400, 400]
        assert login("right") == 429  # refused without checking: even the right password waits
        assert login("right", other_address) == 200  # another address is not held back
        for _ in range(60):
            if (status := login("right")) != 429:
                break
            time.sleep(0.5)
        assert status == 200
        assert login("wrong") == 400  # a success clears the count
    finally:
        other_address.close()
        guarded.close()


# -- serve's arguments and gallery, refused before it starts -------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--port", "70000"], "--port must be between 1 and 65535, got 70000"),
    (["--port", "-1"], "--port must be between 1 and 65535, got -1"),
    (["--host", "256.1.1.1"], "--host 256.1.1.1 is not an address or a known host name"),
    (["--max-megapixels", "0"], "--max-megapixels must be a positive number of at most 100, got 0"),
    (["--max-megapixels", "-1"], "--max-megapixels must be a positive number of at most 100, got -1"),
    (["--max-upload-mb", "inf"], "--max-upload-mb must be a positive number of at most 1024, got inf"),
    (["--concurrency", "0"], "--concurrency must be a positive number of at most 64, got 0"),
    ("missing model", "model.onnx does not exist"),
    ("garbage model", "model.onnx is not a loadable ONNX model"),
])
def test_serve_refuses_bad_arguments_in_one_line_before_starting(digits_gallery: Path, tmp_path: Path,
                                                                  args, message) -> None:
    db = digits_gallery
    if isinstance(args, str):
        db = tmp_path / "gallery"
        shutil.copytree(digits_gallery, db)
        if args == "missing model":
            (db / "model.onnx").unlink()
        else:
            (db / "model.onnx").write_bytes(b"not a model\n" * 100)
        args = []
    port = [] if "--port" in args else ["--port", str(_free_port())]
    done = subprocess.run([sys.executable, "-m", "metricsearch", "serve", "--db", str(db), *port, *args],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("metricsearch serve: error: "), done.stderr
    assert message in done.stderr
