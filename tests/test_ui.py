"""The search page: handlers as plain functions over a real gallery, then a real server on 127.0.0.1
queried through gradio_client (good and bad queries, auth, upload limits, file routes)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gradio as gr
import httpx
import numpy as np
import pytest
from gradio_client import Client, handle_file
from PIL import Image

from metricsearch.app.web import SearchHandlers, parse_auth, serve
from metricsearch.app.web.handlers import NOT_UPLOADED
from metricsearch.app.web.batching import Coalescer


# -- merging concurrent inference calls ---------------------------------------------------------


def wait_until(condition, what: str, seconds: float = 60) -> None:
    """Poll `condition` until it holds; fail the test, naming `what`, after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.001)

def test_coalescer_merges_calls_that_arrive_together_and_keeps_results_apart() -> None:
    calls: list[list[int]] = []
    gate = threading.Event()

    def square(items: list[int]) -> list[int]:
        calls.append(list(items))
        if len(calls) == 1:
            gate.wait(10)  # hold the first call so that the others queue up behind it
        return [i * i for i in items]

    batcher = Coalescer(square, max_batch=16)
    with ThreadPoolExecutor(9) as pool:
        first = pool.submit(batcher, 1)
        wait_until(lambda: calls, "the first call")
        rest = [pool.submit(batcher, i) for i in range(2, 10)]
        wait_until(lambda: sum(len(c) for c in calls) + batcher.waiting >= 9, "the other eight queries queued")
        gate.set()
        assert first.result() == 1 and [f.result() for f in rest] == [i * i for i in range(2, 10)]
    assert calls[0] == [1] and sorted(sum(calls[1:], [])) == list(range(2, 10))
    assert len(calls) == 2, calls  # the eight that waited shared one call


def test_coalescer_gives_an_error_only_to_the_item_that_causes_it() -> None:
    calls: list[list[int]] = []
    gate = threading.Event()

    def fail_on_negative(items: list[int]) -> list[int]:
        calls.append(list(items))
        if len(calls) == 1:
            gate.wait(10)  # hold the first call so that the others queue up behind it, the bad one among them
        if any(i < 0 for i in items):
            raise ValueError("negative")
        return items

    batcher = Coalescer(fail_on_negative, max_batch=8)
    with ThreadPoolExecutor(6) as pool:
        first = pool.submit(batcher, 0)
        wait_until(lambda: calls, "the first call")
        rest = {i: pool.submit(batcher, i) for i in (1, 2, -3, 4, 5)}
        wait_until(lambda: batcher.waiting >= 5, "the five queries queued")
        gate.set()
        assert first.result() == 0 and [rest[i].result() for i in (1, 2, 4, 5)] == [1, 2, 4, 5]
        with pytest.raises(ValueError, match="negative"):
            rest[-3].result()
    assert sorted(calls[1]) == [-3, 1, 2, 4, 5]  # they did share a call, which failed, then ran alone
    assert batcher(3) == 3


def test_parse_auth(tmp_path: Path) -> None:
    assert parse_auth() is None
    assert parse_auth("ann:s3:cret") == [("ann", "s3:cret")]
    users = tmp_path / "users"
    users.write_text("# who may log in\nann:one\n\nbob:two\n")
    assert parse_auth(auth_file=users) == [("ann", "one"), ("bob", "two")]
    for bad in ("ann", "ann:", ":pw"):
        with pytest.raises(ValueError, match="USER:PASS"):
            parse_auth(bad)


# -- the handlers, as plain functions over a real gallery ---------------------------------------

@pytest.fixture(scope="module")
def handlers(digits_gallery: Path, tmp_path_factory: pytest.TempPathFactory):
    """Handlers over the digits gallery; query files are read only from their `uploads` folder."""
    from metricsearch.index import Gallery

    with Gallery.open(digits_gallery) as gallery:
        handlers = SearchHandlers(gallery, uploads=tmp_path_factory.mktemp("uploads"))
        yield handlers
        handlers.close()
    assert not handlers.thumbnail_dir.exists()


def _png(tmp_path: Path, image: Image.Image, name: str = "query.png", size: int = 56) -> Path:
    path = tmp_path / name
    image.resize((size, size), Image.BILINEAR).save(path)  # smooth: a blocky copy is another image to the model
    return path


def test_a_gallery_image_comes_back_first_with_its_label(handlers, gallery_items) -> None:
    item_id, label, image = gallery_items[0]
    thumbs, table = handlers.search(str(_png(handlers.uploads, image)), 5)
    assert [set(row) for row in table] == [{"id", "score", "label"}] * 5
    assert table[0]["id"] == item_id and table[0]["label"] == label and table[0]["score"] > 0.99
    assert [s for s in (row["score"] for row in table)] == sorted((row["score"] for row in table), reverse=True)
    assert [Path(t).read_bytes() for t, _ in thumbs] == [handlers.gallery.thumbnail(row["id"]) for row in table]
    assert all(Path(t).parent == handlers.thumbnail_dir for t, _ in thumbs)
    assert thumbs[0][1] == f"{label} · {table[0]['score']:.3f} · #{item_id}"


def test_label_filter_and_the_crop_editors_value(handlers, gallery_items) -> None:
    _, label, image = gallery_items[0]
    other = next(lab for lab in handlers.labels if lab != label)
    editor = {"background": None, "layers": [], "composite": {"path": str(_png(handlers.uploads, image))}}
    _, table = handlers.search(editor, 7, other)
    assert len(table) == 7 and {row["label"] for row in table} == {other}


def test_clicking_a_result_searches_with_its_thumbnail(handlers, gallery_items) -> None:
    _, table = handlers.search(gallery_items[1][2], 4)
    query, _, again = handlers.search_id(table, 4, "", gr.SelectData(None, {"index": 2, "value": None}))
    assert Path(query).read_bytes() == handlers.gallery.thumbnail(table[2]["id"]) and again[0]["id"] == table[2]["id"]


@pytest.mark.parametrize("value, k, label, message", [
    (None, 5, "", "No image to search"),
    ("OUTSIDE", 5, "", NOT_UPLOADED),
    ("TEXT", 5, "", "Cannot search with this file. notes.txt: not an image"),
    ("IMAGE", 0, "", "k must be between 1 and 50"),
    ("IMAGE", 5, "no-such-label", "no label 'no-such-label'"),
])
def test_bad_queries_get_a_friendly_message(handlers, gallery_items, tmp_path: Path, value, k, label, message) -> None:
    text = handlers.uploads / "notes.txt"
    text.write_text("not an image")
    outside = _png(tmp_path, gallery_items[0][2])  # a real image, but not in the upload folder
    value = {"TEXT": str(text), "IMAGE": gallery_items[0][2], "OUTSIDE": str(outside)}.get(value, value)
    with pytest.raises(gr.Error) as info:
        handlers.search(value, k, label)
    assert message in info.value.message and str(tmp_path) not in info.value.message
    assert str(handlers.uploads) not in info.value.message


def test_handlers_start_where_gradio_has_made_no_upload_folder_yet(handlers, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "fresh" / "gradio"))  # as on a fresh machine
    fresh = SearchHandlers(handlers.gallery)
    assert fresh.thumbnail_dir.parent == tmp_path / "fresh" / "gradio" and fresh.thumbnail_dir.is_dir()
    fresh.close()


def test_the_pixel_limit_refuses_large_queries(handlers) -> None:
    small_limit = SearchHandlers(handlers.gallery, max_pixels=64 * 64, uploads=handlers.uploads)
    big = handlers.uploads / "big.png"
    Image.new("L", (65, 64)).save(big)
    with pytest.raises(gr.Error, match="over the limit of 4096"):
        small_limit.search(str(big))
    small_limit.close()


def test_about_panel_names_model_size_index_and_device(handlers) -> None:
    about = handlers.about()
    for field in ("- **model**: `", "- **dimension**: `128`", "- **items**: `896`", "- **index type**: `",
                  "- **search setting**: `", "- **device**: `", "- **why this index**: `",
                  "- **candidates (* chosen)**: `*IDMap,Flat exact: recall@10 1.000"):
        assert field in about, about
    assert str(handlers.gallery.db) not in about  # no server paths on the page
    assert "- **measured recall**: `exact search" in about, about  # a flat index measures nothing (issue 17)


def test_evaluate_tab_shows_the_worst_queries_and_classes_of_the_served_gallery(handlers, digits_gallery) -> None:
    from metricsearch.app.web.handlers import CLASS_COLUMNS
    from metricsearch.evaluation.thumbnails import GREEN, RED
    from metricsearch.index import evaluate_gallery

    worst, classes = handlers.evaluation()
    assert isinstance(worst, Image.Image) and worst.width > 96 and worst.height > 96
    rows = [dict(zip(CLASS_COLUMNS, row)) for row in classes]
    assert sorted(row["label"] for row in rows) == handlers.labels
    assert [row["recall_at_1"] for row in rows] == sorted(row["recall_at_1"] for row in rows)  # worst first
    metrics = evaluate_gallery(digits_gallery, with_nmi=False)
    assert sum(row["queries"] for row in rows) == metrics["n_queries"]
    weighted = sum(row["queries"] * row["recall_at_1"] for row in rows) / metrics["n_queries"]
    assert abs(weighted - metrics["recall_at_k"][1]) <= 0.01, (weighted, metrics["recall_at_k"])
    assert handlers.evaluation() is handlers.evaluation()  # computed once per server
    assert any(row["recall_at_1"] < 1 for row in rows)  # the digits model misses some: their rows show red frames
    assert np.all(np.asarray(worst) == RED, axis=-1).sum() > 100 and np.all(np.asarray(worst) == GREEN, axis=-1).any()


# -- a real server on 127.0.0.1, through gradio_client ----------------------------------------

def test_client_search_bad_upload_then_good_again(server, gallery_items, tmp_path: Path) -> None:
    client = Client(server.url, verbose=False, download_files=False)
    item_id, label, image = gallery_items[0]
    query = handle_file(str(_png(tmp_path, image)))
    thumbs, hits = client.predict(query, 3, api_name="/search")
    assert hits[0] == {"id": item_id, "score": hits[0]["score"], "label": label} and hits[0]["score"] > 0.99
    assert len(thumbs) == 3 and thumbs[0]["caption"].endswith(f"#{item_id}")
    pages = tmp_path / "pages.tiff"  # a multi-page TIFF searches with its first page
    Image.open(_png(tmp_path, image)).save(pages, save_all=True, append_images=[Image.new("RGB", (90, 30), "red")])
    assert Image.open(pages).n_frames == 2
    assert client.predict(handle_file(str(pages)), 3, api_name="/search")[1] == hits
    text = tmp_path / "notes.txt"
    text.write_text("not an image")
    with pytest.raises(Exception, match="notes.txt: not an image"):
        client.predict(handle_file(str(text)), api_name="/search")
    noise = tmp_path / "noise.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (700, 700, 3), dtype=np.uint8)).save(noise)
    assert noise.stat().st_size > 1024 * 1024  # over the test server's --max-upload-mb 1
    with pytest.raises(Exception):
        client.predict(handle_file(str(noise)), api_name="/search")
    _, hits = client.predict(query, api_name="/search")
    assert len(hits) == 10 and hits[0]["id"] == item_id


def test_eight_clients_at_once_get_what_one_client_gets(server, gallery_items, tmp_path: Path) -> None:
    queries = [handle_file(str(_png(tmp_path, image, f"{item_id}.png"))) for item_id, _, image in gallery_items]
    alone = Client(server.url, verbose=False, download_files=False)
    expected = [alone.predict(query, 5, api_name="/search")[1] for query in queries]
    assert [hits[0]["label"] for hits in expected] == [label for _, label, _ in gallery_items]

    def one_client(n: int) -> list:
        client = Client(server.url, verbose=False, download_files=False)
        return [client.predict(query, 5, api_name="/search")[1] for query in queries[n % 2::2]]

    with ThreadPoolExecutor(8) as pool:
        found = list(pool.map(one_client, range(8)))
    for n, hits in enumerate(found):
        assert hits == expected[n % 2::2]


def test_nothing_outside_the_gallery_can_be_fetched(server, digits_gallery: Path, digits_onnx: Path) -> None:
    secrets = ["/etc/passwd", str(digits_onnx), *map(str, sorted(digits_gallery.rglob("*.mdb")))]
    assert len(secrets) >= 2
    for secret in secrets:
        for route in (f"file={secret}", f"gradio_api/file={secret}", f"gradio_api/file=../../../..{secret}",
                      f"gradio_api/file=%2e%2e/%2e%2e/%2e%2e/%2e%2e{secret}", f"static/../../../..{secret}",
                      f"assets/..%2f..%2f..%2f..{secret}"):
            response = httpx.get(server.url + route, timeout=30)
            assert response.status_code != 200 or Path(secret).read_bytes()[:64] not in response.content, route
    # the API refuses files that were not uploaded to it, in every form and on every endpoint
    passwd = {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}
    for endpoint, query in [("search", passwd), ("search", "/etc/passwd"), ("search", {"path": "/etc/passwd"}),
                            ("page_search", {"background": None, "layers": [], "composite": passwd}),
                            ("page_search", "/etc/passwd")]:
        call = httpx.post(f"{server.url}gradio_api/call/{endpoint}", json={"data": [query, 5, ""]}, timeout=30)
        if call.status_code == 200:
            events = httpx.get(f"{server.url}gradio_api/call/{endpoint}/{call.json()['event_id']}", timeout=30).text
            assert "event: error" in events and "root:" not in events, (endpoint, query, events)


def test_auth_refuses_a_wrong_password(digits_gallery: Path, gallery_items, tmp_path: Path, free_port: int) -> None:
    guarded = serve(digits_gallery, port=free_port, auth=[("ann", "right")], block=False, log=lambda _: None)
    try:
        with pytest.raises(Exception, match="(?i)login"):
            Client(guarded.url, verbose=False, auth=("ann", "wrong"))
        assert httpx.get(guarded.url + "config", timeout=30).status_code in (401, 403)
        client = Client(guarded.url, verbose=False, auth=("ann", "right"), download_files=False)
        item_id, _, image = gallery_items[1]
        assert client.predict(handle_file(str(_png(tmp_path, image))), 1, api_name="/search")[1][0]["id"] == item_id
    finally:
        guarded.close()



def test_a_taken_port_is_a_one_line_error(digits_gallery: Path, free_port: int, capsys) -> None:
    import socket

    from metricsearch.app.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port))
        taken.listen()
        assert main(["serve", "--db", str(digits_gallery), "--port", str(free_port)]) == 2
    assert capsys.readouterr().err == (f"metricsearch serve: error: port {free_port} on 127.0.0.1 is taken "
                                       "(another server?): pass another --port\n")


SIDE_EFFECTS = """
import ctypes, ctypes.util, json, os, signal, socket, sys
import faiss
import gradio  # its own import sets HF_HUB_DISABLE_TELEMETRY: not ours to undo

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype, libc.malloc.restype = MallInfo2, ctypes.c_void_p
libc.malloc.argtypes, libc.free.argtypes = [ctypes.c_size_t], [ctypes.c_void_p]

def mapped(size=512 * 1024, count=128):  # whether glibc maps such buffers on their own (over its mmap threshold)
    before = libc.mallinfo2().hblkhd  # once the heap's free chunks are used up: glibc takes them first
    buffers = [libc.malloc(size) for _ in range(count)]
    own = libc.mallinfo2().hblkhd > before
    for buffer in buffers:
        libc.free(buffer)
    return own

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def mine(signum, frame):
    pass

faiss.omp_set_num_threads(3)
signal.signal(signal.SIGTERM, mine)
libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD at glibc's default value (glibc cannot tell the one in force)
state = lambda: (dict(os.environ), faiss.omp_get_max_threads(), signal.getsignal(signal.SIGTERM), mapped())
before = state()
from metricsearch.app.web import serve
server = serve(sys.argv[1], port=free_port(), block=False, log=lambda _: None)
during = faiss.omp_get_max_threads(), mapped()
server.close()
after_close = state()

def sigterm_now(message):  # the blocking server is up: SIGTERM stops it as Ctrl-C does
    os.kill(os.getpid(), signal.SIGTERM)

try:
    serve(sys.argv[1], port=free_port(), log=sigterm_now)
    stopped = False
except KeyboardInterrupt:
    stopped = True
after_block = state()
changed = lambda after: [k for k in set(before[0]) | set(after[0]) if before[0].get(k) != after[0].get(k)]
print(json.dumps({"during": during, "stopped": stopped, "mapped": [before[3], after_close[3], after_block[3]],
                  "env": [changed(after_close), changed(after_block)],
                  "threads": [after_close[1], after_block[1]],
                  "handler_kept": [after_close[2] is mine, after_block[2] is mine]}))
"""


def test_serve_leaves_the_process_as_it_found_it(digits_gallery: Path) -> None:
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SIDE_EFFECTS, str(digits_gallery)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["during"] == [1, False]  # one OpenMP thread per search; 512 KiB buffers on the heap
    assert result["mapped"] == [True, True, True]  # glibc's mmap threshold as found, after either way of serving
    assert result["stopped"]
    assert result["env"] == [[], []]  # no environment variable set, at import or while serving
    assert result["threads"] == [3, 3] and result["handler_kept"] == [True, True]
