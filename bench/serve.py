"""Latency and throughput of the served search, both paths (the page's queued `/search` endpoint and the
JSON API's `POST /api/search`), against a gallery, beside bare `Gallery.search`.

Builds (once, under --workdir) a gallery of --items images: the digits, scaled to 28 px and
jittered (rotation, shift, noise) so that no two are alike; then serves it with
`metricsearch serve` in a subprocess on 127.0.0.1 and sends --queries fresh jittered digits
from 1 and from 8 concurrent clients (each its own thread and connection) of each path:
`gradio_client` for `/search`, an httpx client posting the PNG for `/api/search`. In
the same run it times `Gallery.search` on the same query files, one at a time, in this process
(one faiss thread, as the server runs it).
Prints one markdown table: p50/p99 latency, throughput and errors, the served/bare p50 ratio, and the
JSON route's p50 over the page path's at the same client count.

    metricsearch demo --no-serve     # makes metricsearch-demo/model.onnx
    python bench/serve.py --model metricsearch-demo/model.onnx --items 10000 --queries 400
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import faiss
import numpy as np
from PIL import Image

from metricsearch.data import load_split
from metricsearch.index import Gallery, build_gallery


def jittered_digits(folder: Path, n: int, seed: int) -> list[Path]:
    """`n` PNGs in folder/<digit>/: every digit in turn, 28 px, randomly rotated, shifted and noised."""
    split = load_split("digits")
    images = ([split.train.load(i) for i in range(len(split.train))]
              + [split.test.load(i) for i in range(len(split.test))])
    labels = ([split.train.class_names[c] for c in split.train.labels]
              + [split.test.class_names[c] for c in split.test.labels])
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        j = i % len(images)
        big = images[j].resize((28, 28), Image.BILINEAR)
        moved = big.rotate(rng.uniform(-12, 12), translate=tuple(rng.integers(-2, 3, 2)), fillcolor=0)
        noisy = np.clip(np.asarray(moved, np.int16) + rng.integers(-20, 21, (28, 28)), 0, 255).astype(np.uint8)
        path = folder / labels[j] / f"{i:06d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(noisy).save(path)
        paths.append(path)
    return paths


def percentiles(seconds: list[float]) -> tuple[float, float]:
    """(p50, p99) in milliseconds."""
    ms = np.asarray(seconds) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, server: subprocess.Popen, timeout: float = 120) -> None:
    import httpx

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with code {server.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server did not answer on {url} within {timeout:.0f} s")


def gradio_caller(url: str, k: int) -> Callable[[Path], object]:
    """One client of the page's queued `/search` endpoint."""
    from gradio_client import Client, handle_file

    # ssl_verify=False: there is no TLS on http://127.0.0.1, but gradio_client builds a new httpx client,
    # loading the CA bundle (~50 ms of CPU), for each call unless told not to verify
    client = Client(url, verbose=False, download_files=False, ssl_verify=False)
    return lambda q: client.predict(handle_file(str(q)), k, api_name="/search")


def json_caller(url: str, k: int) -> Callable[[Path], object]:
    """One client (one keep-alive connection) of the JSON API's `POST /api/search`."""
    import httpx

    client = httpx.Client(base_url=url, timeout=60)

    def call(q: Path) -> object:
        answer = client.post("api/search", files={"image": (q.name, q.read_bytes(), "image/png")}, data={"k": k})
        answer.raise_for_status()
        return answer.json()["hits"]
    return call


def run_clients(make: Callable[[], Callable[[Path], object]], queries: list[Path],
                clients: int) -> tuple[list[float], int, float]:
    """(per-request seconds, errors, wall seconds) of `clients` threads sharing the queries."""
    connections = [make() for _ in range(clients)]
    for c in connections:  # warm-up: one query each, not timed
        c(queries[0])

    def worker(c: int) -> tuple[list[float], int]:
        times, errors = [], 0
        for q in queries[c::clients]:
            start = time.perf_counter()
            try:
                connections[c](q)
                times.append(time.perf_counter() - start)
            except Exception as exc:  # counted, not raised: the run goes on
                errors += 1
                print(f"client {c}: {exc}", file=sys.stderr)
        return times, errors

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(worker, range(clients)))
    wall = time.perf_counter() - start
    return [t for times, _ in results for t in times], sum(e for _, e in results), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="exported ONNX model (e.g. metricsearch-demo/model.onnx)")
    parser.add_argument("--items", type=int, default=10_000, help="gallery size")
    parser.add_argument("--queries", type=int, default=400, help="queries per client count")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8], help="concurrent client counts")
    parser.add_argument("--k", type=int, default=10, help="neighbours per query")
    parser.add_argument("--concurrency", type=int, default=4, help="the server's --concurrency")
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "metricsearch-bench-serve"),
                        help="where the gallery and query images are kept between runs")
    args = parser.parse_args()

    work = Path(args.workdir)
    db = work / f"gallery-{args.items}"
    if not (db / "report.json").is_file():
        jittered_digits(work / f"images-{args.items}", args.items, seed=0)
        build_gallery(args.model, f"folder:{work / f'images-{args.items}'}", db, overwrite=True)
    queries = jittered_digits(Path(tempfile.mkdtemp(prefix="queries-", dir=work)), args.queries, seed=1)

    load_before = f"{os.getloadavg()[0]:.1f}"
    faiss.omp_set_num_threads(1)  # as `metricsearch serve` runs its searches
    with Gallery.open(db) as gallery:
        info = gallery.info()
        gallery.search([str(queries[0])], args.k)  # warm-up
        bare = []
        for q in queries:
            start = time.perf_counter()
            gallery.search([str(q)], args.k)
            bare.append(time.perf_counter() - start)
    bare_p50, bare_p99 = percentiles(bare)

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    server = subprocess.Popen([sys.executable, "-m", "metricsearch", "serve", "--db", str(db), "--port", str(port),
                               "--concurrency", str(args.concurrency)], stdout=subprocess.DEVNULL)
    rows, page_p50 = [], {}
    try:
        wait_for(url, server)
        for clients in args.clients:
            for path, caller in (("page `/search`", gradio_caller), ("JSON `/api/search`", json_caller)):
                times, errors, wall = run_clients(lambda: caller(url, args.k), queries, clients)
                p50, p99 = percentiles(times)
                page_p50.setdefault(clients, p50)
                rows.append(f"| {path} | {clients} | {p50:.1f} | {p99:.1f} | {len(times) / wall:.1f} | {errors} | "
                            f"{bare_p50:.2f} | {p50 / bare_p50:.1f} | {p50 / page_p50[clients]:.2f} |")
    finally:
        server.terminate()
        server.wait(30)

    print(f"gallery: {info['count']} items, {info['dim']}-d, index {info['index_type']} {info['search_params']}, "
          f"k = {args.k}, {len(queries)} queries per row, server --concurrency {args.concurrency}; "
          f"bare Gallery.search p50 {bare_p50:.2f} ms, p99 {bare_p99:.2f} ms (one query at a time, same files)\n")
    print(f"load average before / after: {load_before} / {os.getloadavg()[0]:.1f}\n")
    print("| path | clients | p50 (ms) | p99 (ms) | queries/s | errors | bare search p50 (ms) | served/bare p50 "
          "| p50 / page p50 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
