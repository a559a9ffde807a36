"""Memory per request (issue 86): a query is decoded and resized to the model's input at once, a strip of rows at a
time where its mode needs converting, large ones a few at a time across requests, and the ink box never makes a
square larger than INK_SQUARE_SIDE. Checked on the embeddings of a real ONNX model and on the peak resident memory
of real `metricsearch serve` processes on 127.0.0.1 (VmHWM in /proc, reset before each scenario)."""

from __future__ import annotations

import io
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image, ImageDraw

from metricsearch.app.web import SearchHandlers
from metricsearch.data import images, load_image
from metricsearch.index import Gallery, build_gallery
from metricsearch.models import preprocessing
from metricsearch.models.preprocessing import INK_SQUARE_SIDE, Preprocessing

from onnx_models import pixel_correlation_onnx
from test_serve_safety import TIMEOUT, Served, _png

pytestmark = pytest.mark.timeout(900)
MB = 1 << 20


def _gradient(mode: str, width: int, height: int) -> Image.Image:
    """An L, LA, RGB or RGBA image whose rows are one gradient, each band its own (alpha too): megapixels that
    compress to kilobytes."""
    bands = len(mode)
    row = (np.arange(width)[:, None] * 255 // (width - 1) * np.arange(1, bands + 1) % 256).astype(np.uint8)
    pixels = np.broadcast_to(row, (height, width, bands))
    return Image.fromarray(np.ascontiguousarray(pixels[..., 0] if bands == 1 else pixels))


def _encoded(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


@pytest.fixture(scope="module")
def galleries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two galleries of the digits' test part: a 12 px RGB stretching model, and the Omniglot recipe's policy
    (28 px grey, `resize: ink_box`); both real ONNX models (tests/onnx_models.py)."""
    root = tmp_path_factory.mktemp("memory")
    out = {}
    for name, size, channels in (("stretch", 12, 3), ("ink_box", 28, 1)):
        model = pixel_correlation_onnx(root / f"{name}.onnx", size, channels, name)
        build_gallery(model, "digits", root / name, part="test")
        out[name] = root / name
    return out


# -- the same embeddings -----------------------------------------------------------------------------------

QUERIES = {
    "RGBA PNG": lambda: _encoded(_gradient("RGBA", 900, 700), "PNG"),
    "LA PNG": lambda: _encoded(_gradient("LA", 700, 900), "PNG"),
    "16-bit PNG": lambda: _encoded(Image.fromarray(np.tile(np.arange(900, dtype=np.uint16) * 71, (700, 1))), "PNG"),
    "float TIFF": lambda: _encoded(Image.fromarray(np.tile(np.linspace(-20, 300, 900, dtype=np.float32), (700, 1))),
                                   "TIFF"),
    "CMYK TIFF": lambda: _encoded(_gradient("RGB", 900, 700).convert("CMYK"), "TIFF"),
    "paletted PNG with transparency": lambda: _encoded(_gradient("RGB", 900, 700).quantize(64), "PNG",
                                                       transparency=3),
}


@pytest.mark.parametrize("kind", QUERIES)
def test_a_query_resized_at_once_has_the_embedding_of_the_full_size_image(galleries, kind: str,
                                                                          tmp_path: Path) -> None:
    """The page's path (decode and resize at once, keep only the small image) against the path before it (the whole
    decoded image handed to `Gallery.search`): the same hits with the same scores from the real ONNX model."""
    data = QUERIES[kind]()
    with Gallery.open(galleries["stretch"]) as gallery:
        handlers = SearchHandlers(gallery, uploads=tmp_path)
        try:
            query = handlers.query(data, 10)
            assert query.image.size == (12, 12)  # all that waits for the shared inference call
            ours = handlers.hits([query])[0]
        finally:
            handlers.close()
        full = load_image(data, max_pixels=handlers.max_pixels, min_side=handlers.min_side)
        before = [{"id": int(h.id), "score": round(float(h.score), 4), "label": h.label}
                  for h in gallery.search([full], 10)[0]]
    assert ours == before


def test_a_jpeg_query_is_decoded_as_the_indexer_decodes_gallery_images(galleries, tmp_path: Path) -> None:
    """A JPEG decodes at a reduced scale (draft), as `index build` decodes it: a gallery item's own file finds it
    with the score the index gives it, and a 4000 x 3000 photo never decodes at full size."""
    data = _encoded(_gradient("RGB", 4000, 3000), "JPEG", quality=90)
    with Gallery.open(galleries["stretch"]) as gallery:
        handlers = SearchHandlers(gallery, uploads=tmp_path)
        try:
            ours = handlers.hits([handlers.query(data, 10)])[0]
        finally:
            handlers.close()
        indexer = [{"id": int(h.id), "score": round(float(h.score), 4), "label": h.label}
                   for h in gallery.search([data], 10)[0]]
    assert ours == indexer


@pytest.mark.parametrize("mode", ["RGBA", "LA", "I;16", "I", "F", "P"])
def test_modes_converted_a_strip_at_a_time_are_the_whole_image_converted(mode: str, monkeypatch) -> None:
    rng = np.random.default_rng(0)
    pixels = rng.integers(-50, 70000, (97, 131)).astype(np.float32 if mode == "F" else np.int32)
    image = (Image.fromarray(rng.integers(0, 256, (97, 131, 4), np.uint8)).convert(mode) if mode in ("RGBA", "LA", "P")
             else Image.fromarray(pixels).convert(mode))
    if mode == "P":
        image.info["transparency"] = 7
    monkeypatch.setattr(images, "STRIP_PIXELS", 10**9)
    whole = images.to_mode(image, None)
    monkeypatch.setattr(images, "STRIP_PIXELS", 997)  # 7 rows a strip, the last one short
    strips = images.to_mode(image, None)
    assert strips.mode == whole.mode and np.array_equal(np.asarray(strips), np.asarray(whole))


def test_the_ink_box_of_ink_far_apart_is_made_reduced_and_looks_as_the_full_square(monkeypatch) -> None:
    """Ink at both ends of a 6000 x 400 drawing: a 7500 px square at full scale (56 MB), made at most
    INK_SQUARE_SIDE px instead, and the model's input from it within a grey level or two of the full square's."""
    drawing = Image.new("L", (6000, 400), 255)
    pen = ImageDraw.Draw(drawing)
    pen.line([(20, 30), (700, 370)], fill=0, width=300)
    pen.line([(5980, 30), (5300, 370)], fill=0, width=300)
    pen.ellipse([(2600, 40), (3400, 360)], fill=40)
    pre = Preprocessing(size=28, resize="ink_box", ink_fill=0.8)
    assert max(preprocessing.ink_square(drawing, 0.8).size) <= INK_SQUARE_SIDE
    reduced = np.asarray(pre.resized(drawing), np.int16)
    monkeypatch.setattr(preprocessing, "INK_SQUARE_SIDE", 10**6)
    assert preprocessing.ink_square(drawing, 0.8).size == (7500, 7500)  # the ink spans all 6000 px
    full = np.asarray(pre.resized(drawing), np.int16)
    assert reduced.min() < 200 and np.abs(reduced - full).max() <= 2, np.abs(reduced - full).max()


# -- peak memory of a real server --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def servers(galleries, tmp_path_factory: pytest.TempPathFactory):
    """A `metricsearch serve` process per gallery, started side by side."""
    logs = tmp_path_factory.mktemp("logs")
    with ThreadPoolExecutor(2) as pool:
        started = dict(zip(galleries, pool.map(lambda name: Served(galleries[name], logs / f"{name}.log"), galleries)))
    yield started
    for server in started.values():
        server.close()


def _api(server: Served, files: list[bytes], route: str = "api/search/batch") -> list[dict]:
    """The results of one JSON API request (`images` for the batch route, `image` for the other)."""
    field = "images" if route.endswith("batch") else "image"
    answer = httpx.post(server.url + route, files=[(field, (f"q{i}.png", data, "image/png"))
                                                   for i, data in enumerate(files)], data={"k": 3}, timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text
    return answer.json().get("results") or [answer.json()]


def _warm_idle(server: Served) -> int:
    """The server's resident bytes at rest, after every path has run once."""
    small = _png(_gradient("RGB", 64, 64))
    for _ in range(2):
        assert server.search(small)[0] == "complete"
        assert "hits" in _api(server, [small], "api/search")[0]
    time.sleep(2)
    return server.status("VmRSS")


def _peak_over(server: Served, idle: int, send) -> int:
    """Peak resident bytes over `idle` while `send()` runs (VmHWM reset first)."""
    server.reset_peak()
    send()
    return server.status("VmHWM") - idle


def _back_near(server: Served, idle: int) -> int:
    """Resident bytes once within 20% of idle (freed memory is given up to 30 s, never asserted on speed)."""
    for _ in range(30):
        if (now := server.status("VmRSS")) <= 1.2 * idle:
            break
        time.sleep(1)
    return now


def test_a_hostile_batch_and_8_hostile_requests_at_once_stay_within_memory_bounds(servers) -> None:
    """16 RGBA PNGs of 3000 x 3000 (36 MB of pixels each, 40 KB files) in one batch: at most 300 MB over idle; 8
    requests at once, 4 page `/search` uploads and 4 JSON API ones of a 4000 x 4000 RGBA PNG (64 MB of pixels, 60 KB):
    at most 1 GB; then back within 20% of idle."""
    server = servers["stretch"]
    idle = _warm_idle(server)
    nine, sixteen = _png(_gradient("RGBA", 3000, 3000)), _png(_gradient("RGBA", 4000, 4000))
    assert len(nine) < 100_000 and len(sixteen) < 100_000
    answers = []
    batch = _peak_over(server, idle, lambda: answers.extend(_api(server, [nine] * 16)))
    assert len(answers) == 16 and all(len(answer["hits"]) == 3 for answer in answers), answers

    def one(i: int) -> bool:
        return server.search(sixteen)[0] == "complete" if i % 2 else "hits" in _api(server, [sixteen], "api/search")[0]
    with ThreadPoolExecutor(8) as pool:
        eight = _peak_over(server, idle, lambda: answers.extend(pool.map(one, range(8))))
    assert answers[16:] == [True] * 8
    after = _back_near(server, idle)
    print(f"\nidle {idle / MB:.0f} MB; a batch of 16 +{batch / MB:.0f} MB; 8 requests at once +{eight / MB:.0f} MB; "
          f"after {after / MB:.0f} MB")
    assert batch <= 300 * MB and eight <= 1024 * MB and after <= 1.2 * idle, (idle, batch, eight, after)


def test_an_ink_box_gallery_searches_a_long_drawing_within_memory_bounds(servers) -> None:
    """The Omniglot recipe's policy, one 25000 x 1000 white PNG (30 KB) with two black pixels far apart: its ink
    box is a 31250 px square (977 MB of grey) at full scale; at most 300 MB over idle, then back within 20%."""
    server = servers["ink_box"]
    idle = _warm_idle(server)
    long = Image.new("L", (25000, 1000), 255)
    long.putpixel((10, 10), 0)
    long.putpixel((24989, 989), 0)
    data = _png(long)
    assert len(data) < 100_000
    answers = []
    peak = _peak_over(server, idle, lambda: answers.extend(_api(server, [data], "api/search")))
    assert len(answers[0]["hits"]) == 3, answers
    after = _back_near(server, idle)
    print(f"\nidle {idle / MB:.0f} MB; the long drawing +{peak / MB:.0f} MB; after {after / MB:.0f} MB")
    assert peak <= 300 * MB and after <= 1.2 * idle, (idle, peak, after)
