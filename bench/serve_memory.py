"""Peak memory of `metricsearch serve` per request (issue 86's hostile queries): a reference commit against this
tree, in one run.

Makes two tiny real ONNX models (tests/onnx_models.py: 12 px RGB stretched, and 28 px grey with the Omniglot
recipe's `resize: ink_box`), the hostile query files (5000 x 5000 RGBA, 16-bit RGBA and LA PNGs, a CMYK JPEG, RGBA
and float TIFFs, each under 4 MB; a 25000 x 1000 white PNG with two black pixels far apart) and, for each code
(the --ref commit exported with `git archive` into a temporary folder, removed after; then this tree), a gallery
of the digits per model built by that code's `index build`. Each code serves each gallery with `python -m
metricsearch serve` (PYTHONPATH naming the reference's copy), warmed up with small queries; before each scenario
its resident memory settles (idle), its peak (VmHWM) is reset through /proc/PID/clear_refs (where that is not
allowed, VmRSS polled every 10 ms is the peak), and the scenario's requests are sent at once. Prints one markdown
table: peak over idle per code, the time the requests took, and the ratio; then idle and settled RSS per server.

    python bench/serve_memory.py --ref HEAD --out bench/results/serve_memory.md
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import httpx
import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

from onnx_models import pixel_correlation_onnx  # noqa: E402
from serve import free_port, gradio_caller, wait_for  # noqa: E402

MB = 1 << 20
SIDE = 5000
TIMEOUT = 600  # a bound for a hung request, never a measure


def _gradient(mode: str, channels: int, dtype: type = np.uint8) -> Image.Image:
    """A SIDE x SIDE image whose rows are one smooth gradient per channel (alpha too): it compresses to little."""
    peak = np.iinfo(dtype).max if np.issubdtype(dtype, np.integer) else 255.0
    row = (np.linspace(0, 1, SIDE)[:, None] * np.arange(1, channels + 1) % 1 * peak).astype(dtype)
    return Image.fromarray(np.ascontiguousarray(np.broadcast_to(row, (SIDE, SIDE, channels)).squeeze()), mode)


def _png16_rgba(path: Path) -> None:
    """A SIDE x SIDE 16-bit RGBA PNG (Pillow writes no such file), its rows one gradient."""
    row = b"\0" + ((np.arange(SIDE * 4) % 4093) * 16).astype(">u2").tobytes()
    pack = zlib.compressobj(9)
    data = b"".join(pack.compress(row) for _ in range(SIDE)) + pack.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", SIDE, SIDE, 16, 6, 0, 0, 0))
                     + chunk(b"IDAT", data) + chunk(b"IEND", b""))


def hostile_files(folder: Path) -> dict[str, Path]:
    """The hostile query files by name, made once."""
    folder.mkdir(parents=True, exist_ok=True)
    makers: dict[str, Callable[[Path], None]] = {
        "rgba.png": lambda p: _gradient("RGBA", 4).save(p),
        "rgba16.png": _png16_rgba,
        "la.png": lambda p: _gradient("LA", 2).save(p),
        "cmyk.jpg": lambda p: _gradient("CMYK", 4).save(p, quality=90),
        "rgba.tif": lambda p: _gradient("RGBA", 4).save(p, compression="tiff_adobe_deflate", strip_size=1 << 22),
        "float.tif": lambda p: _gradient("F", 1, np.float32).save(p, compression="tiff_adobe_deflate",
                                                                   strip_size=1 << 22),
        "long.png": lambda p: _two_dots().save(p),
        "small.png": lambda p: _gradient("RGB", 3).resize((64, 64)).save(p),
    }
    paths = {}
    for name, make in makers.items():
        paths[name] = folder / name
        if not paths[name].is_file():
            make(paths[name])
    return paths


def _two_dots() -> Image.Image:
    """25000 x 1000 white, with a black pixel near each end."""
    image = Image.new("L", (25000, 1000), 255)
    image.putpixel((10, 10), 0)
    image.putpixel((24989, 989), 0)
    return image


class Server:
    """`python -m metricsearch serve` of one code over one gallery; its /proc status."""

    def __init__(self, db: Path, env: dict[str, str], log: Path) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/"
        self.process = subprocess.Popen([sys.executable, "-m", "metricsearch", "serve", "--db", str(db), "--port",
                                         str(port)], env=env, cwd=tempfile.gettempdir(), stdout=subprocess.DEVNULL,
                                        stderr=log.open("w"))
        wait_for(self.url, self.process)

    def kb(self, key: str) -> int:
        """A /proc/PID/status value (kB)."""
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines())
        return int(fields[key].split()[0])

    def settled(self, seconds: float = 30) -> float:
        """Resident MB once it stops falling (at most `seconds`)."""
        last, end = self.kb("VmRSS"), time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(1)
            now = self.kb("VmRSS")
            if now >= last - 2048:  # within 2 MB of a second ago
                return now / 1024
            last = now
        return last / 1024

    def peak_of(self, send: Callable[[], int]) -> tuple[float, float, float, int]:
        """(idle MB, peak MB, seconds, failed requests) of `send()`, which returns how many requests failed."""
        idle = self.settled()
        try:
            Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
            reset = True
        except OSError:
            reset = False
        polled, done = [self.kb("VmRSS")], threading.Event()

        def poll() -> None:
            while not done.wait(0.01):
                polled.append(self.kb("VmRSS"))
        sampler = threading.Thread(target=poll, daemon=True)
        sampler.start()
        start = time.perf_counter()
        failed = send()
        seconds = time.perf_counter() - start
        done.set()
        sampler.join()
        peak = max(max(polled), self.kb("VmHWM") if reset else 0)
        return idle, peak / 1024, seconds, failed

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def api(url: str, files: list[Path], route: str = "api/search/batch") -> int:
    """Failed requests (0 or 1) of one JSON API request with these files; an image refused in it counts too."""
    field = "images" if route.endswith("batch") else "image"
    sent = [(field, (p.name, p.read_bytes(), "application/octet-stream")) for p in files]
    answer = httpx.post(url + route, files=sent, data={"k": 5}, timeout=TIMEOUT)
    return int(answer.status_code != 200 or any("error" in r for r in answer.json().get("results", [])))


def at_once(jobs: list[Callable[[], int]]) -> int:
    """Failed requests of jobs sent all at once, each from its own thread."""
    with ThreadPoolExecutor(len(jobs)) as pool:
        return sum(pool.map(lambda job: job(), jobs))


def page(url: str, path: Path) -> int:
    """Failed requests (0 or 1) of one page `/search` call (gradio_client: upload, then the queued call)."""
    try:
        gradio_caller(url, 5)(path)
        return 0
    except Exception as exc:  # counted, not raised: the run goes on
        print(f"page /search: {exc}", file=sys.stderr)
        return 1


def scenarios(files: dict[str, Path]) -> list[tuple[str, str, Callable[[str], int]]]:
    """(name, gallery, send(url) -> failed requests) of each row."""
    batch = {kind: (lambda url, kind=kind: api(url, [files[kind]] * 16)) for kind in ("rgba.png", "cmyk.jpg",
                                                                                      "rgba.tif")}
    return [
        ("`/api/search/batch`, 16 x RGBA PNG", "stretch", batch["rgba.png"]),
        ("`/api/search/batch`, 16 x CMYK JPEG", "stretch", batch["cmyk.jpg"]),
        ("`/api/search/batch`, 16 x RGBA TIFF", "stretch", batch["rgba.tif"]),
        ("two batches of 16 x RGBA PNG at once", "stretch", lambda url: at_once([lambda: batch["rgba.png"](url)] * 2)),
        *[(f"`/api/search`, one {name}", "stretch", lambda url, name=name: api(url, [files[name]], "api/search"))
          for name in ("rgba.png", "rgba16.png", "la.png", "float.tif")],
        ("page `/search`, 8 RGBA PNG uploads at once", "stretch",
         lambda url: at_once([lambda: page(url, files["rgba.png"])] * 8)),
        ("ink_box gallery: `/api/search`, one 25000 x 1000 PNG", "ink_box",
         lambda url: api(url, [files["long.png"]], "api/search")),
    ]


def code_env(code: Path | None) -> dict[str, str]:
    """The environment that runs `code` (a folder holding `metricsearch/`; None: this tree, as installed)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))
    return env


def measure(code: Path | None, work: Path, models: dict[str, Path], files: dict[str, Path]) -> dict[str, tuple]:
    """Each scenario's (idle, peak, seconds, failed) and each gallery's (idle first, settled after) of one code."""
    env, out = code_env(code), {}
    for gallery, model in models.items():
        db = work / gallery
        subprocess.run([sys.executable, "-m", "metricsearch", "index", "build", "--db", str(db), "--model",
                        str(model), "--images", "digits", "--overwrite"], env=env, cwd=tempfile.gettempdir(),
                       check=True, stdout=subprocess.DEVNULL)
        server = Server(db, env, work / f"{gallery}.log")
        try:
            for _ in range(3):
                api(server.url, [files["small.png"]], "api/search")
                page(server.url, files["small.png"])
            first = server.settled()
            for name, where, send in scenarios(files):
                if where == gallery:
                    out[name] = server.peak_of(lambda: send(server.url))
                    print(f"{'this tree' if code is None else 'reference'}: {name}: idle {out[name][0]:.0f} MB, "
                          f"peak {out[name][1]:.0f} MB, {out[name][2]:.1f} s, {out[name][3]} failed", file=sys.stderr)
            out[gallery] = (first, server.settled())
        finally:
            server.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", default="HEAD", help="the reference commit (default: HEAD, the last commit)")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    ref = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=8", args.ref], capture_output=True,
                         text=True, check=True).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="metricsearch-bench-memory-"))
    try:
        files = hostile_files(work / "queries")
        models = {"stretch": pixel_correlation_onnx(work / "stretch.onnx", 12, 3, "stretch"),
                  "ink_box": pixel_correlation_onnx(work / "ink_box.onnx", 28, 1, "ink_box")}
        copy = work / "reference"
        (copy / "metricsearch").mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(copy / "metricsearch")], input=archive, check=True)
        sizes = ", ".join(f"{name} {path.stat().st_size / 1024:,.0f} KB" for name, path in files.items()
                          if name != "small.png")
        results = {}
        for label, code in ((ref, copy), ("this tree", None)):
            (work / label).mkdir()
            results[label] = measure(code, work / label, models, files)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [f"Peak RSS of `metricsearch serve` over its idle RSS, one scenario at a time (its requests sent at once), "
             f"{ref} (the reference) against this tree; {os.cpu_count()} cores, load average "
             f"{os.getloadavg()[0]:.1f} at the end. Query files: {sizes}.", "",
             f"| scenario | {ref} peak over idle (MB) | {ref} s | this tree peak over idle (MB) | this tree s "
             "| this tree / reference |", "|---|---:|---:|---:|---:|---:|"]
    for name, _, _ in scenarios(files):
        (idle_a, peak_a, s_a, failed_a), (idle_b, peak_b, s_b, failed_b) = (results[ref][name],
                                                                            results["this tree"][name])
        mark = lambda failed: f" ({failed} failed)" if failed else ""  # noqa: E731
        lines.append(f"| {name} | +{peak_a - idle_a:,.0f}{mark(failed_a)} | {s_a:.1f} | +{peak_b - idle_b:,.0f}"
                     f"{mark(failed_b)} | {s_b:.1f} | {(peak_b - idle_b) / max(peak_a - idle_a, 1):.2f} |")
    lines += ["", "| server | " + " | ".join(f"{label} idle / settled after (MB)" for label in results) + " |",
              "|---|---:|---:|"]
    for gallery in ("stretch", "ink_box"):
        lines.append(f"| {gallery} gallery | " + " | ".join(
            f"{results[label][gallery][0]:.0f} / {results[label][gallery][1]:.0f}" for label in results) + " |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(f"`python bench/serve_memory.py --ref {args.ref}`\n\n{table}\n")


if __name__ == "__main__":
    main()
