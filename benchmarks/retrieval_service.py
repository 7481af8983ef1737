"""Retrieval throughput and latency in-process vs through the retrieval service (micro-batching), by concurrency.

Clients each send one query at a time (as rollout workers do). In-process, C threads call `kb.search([q], k)`
on one shared retriever; through the service, C HTTP clients post one-query requests to
`python -m retrievers.service` running in its own process on loopback, which encodes concurrent queries together. Also shown: one in-process call with all
queries batched (the throughput ceiling). Real KB: the demo text KB (300 Wikipedia paragraphs, all-MiniLM-L6-v2,
FAISS + BM25 hybrid), built or reused in the kbrouter cache; queries are the first sentences of real passages.

Run (CPU; 2-4 min):

    nice python benchmarks/retrieval_service.py
    nice python benchmarks/retrieval_service.py --concurrency 1 8 32 --queries 300 --max-wait-ms 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def run_clients(fn, queries: list[str], concurrency: int) -> tuple[float, np.ndarray]:
    """Split `queries` over `concurrency` threads calling `fn(q)` one at a time; (seconds, latencies ms)."""
    lat: list[float] = []
    lock = threading.Lock()

    def worker(part: list[str]) -> None:
        for q in part:
            t0 = time.perf_counter()
            fn(q)
            with lock:
                lat.append((time.perf_counter() - t0) * 1000)

    threads = [threading.Thread(target=worker, args=(queries[i::concurrency],)) for i in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, np.asarray(lat)


@contextlib.contextmanager
def service_process(kb_yaml: str, name: str, max_wait_ms: float) -> Iterator[tuple[str, int]]:
    """Run `python -m retrievers.service` for one KB in its own process on a free loopback port; yields (URL, pid)."""
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "retrievers.service",
        "--kb",
        kb_yaml,
        "--only",
        name,
        "--port",
        str(port),
        "--max-wait-ms",
        str(max_wait_ms),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"retrieval service did not start: {' '.join(cmd)}")
            time.sleep(0.5)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process `pid` (all its threads)."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def measure_service(url: str, pid: int, name: str, queries: list[str], concurrency: int, k: int):
    """C client threads posting one-query requests.

    Returns:
        (seconds, latencies ms, mean batch size of this run, CPU seconds of server + clients).
    """
    import httpx

    local = threading.local()
    clients: list = []

    def ask(q: str) -> None:
        if not hasattr(local, "http"):  # one connection pool per client thread
            local.http = httpx.Client(base_url=url, timeout=120)
            clients.append(local.http)
        r = local.http.post("/search", json={"queries": [{"kb": name, "text": q, "k": k}]})
        r.raise_for_status()

    before = httpx.get(url + "/metrics").json()["kbs"][name]
    cpu0 = cpu_seconds(pid) + time.process_time()
    secs, lat = run_clients(ask, queries, concurrency)
    cpu = cpu_seconds(pid) + time.process_time() - cpu0
    after = httpx.get(url + "/metrics").json()["kbs"][name]
    for http in clients:
        http.close()
    return secs, lat, (after["queries"] - before["queries"]) / max(1, after["batches"] - before["batches"]), cpu


def row(c: int, mode: str, secs: float, lat: np.ndarray, n: int, batch: float, cpu: float) -> dict:
    return {
        "clients": c,
        "mode": mode,
        "qps": n / secs,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "batch": batch,
        "cpu_ms_per_query": cpu * 1000 / n,
    }


def measure_pair(kb, url: str, pid: int, name: str, queries: list[str], c: int, k: int) -> list[dict]:
    """In-process and through-the-service rows at `c` clients, printed as they are measured."""
    cpu0 = time.process_time()
    secs, lat = run_clients(lambda q: kb.search([q], k), queries, c)
    local = row(c, "in-process", secs, lat, len(queries), 1.0, time.process_time() - cpu0)
    secs, lat, batch, cpu = measure_service(url, pid, name, queries, c, k)
    remote = row(c, "service", secs, lat, len(queries), batch, cpu)
    for r in (local, remote):
        print(
            f"{c:>7} {r['mode']:<10} {r['qps']:>7.1f} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} {r['batch']:>6.2f} "
            f"{r['cpu_ms_per_query']:>7.1f} {r['qps'] / local['qps']:>9.2f} {r['p50_ms'] / local['p50_ms']:>9.2f} "
            f"{r['cpu_ms_per_query'] / local['cpu_ms_per_query']:>9.2f}",
            flush=True,
        )
    return [local, remote]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb", default=str(ROOT / "configs" / "kb" / "demo.yaml"))
    parser.add_argument("--name", default="text", help="KB name in the YAML")
    parser.add_argument("--queries", type=int, default=120)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads in both processes")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    # One thread each: on a shared machine, OpenMP workers spin while descheduled and inflate both timings.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)

    from retrievers.config import load_kb_configs
    from retrievers.kb import build_kb, load_kb

    (cfg,) = [c for c in load_kb_configs(args.kb) if c.name == args.name]
    build_kb(cfg, progress=False)
    kb = load_kb(cfg)
    passages = [json.loads(line) for line in Path(cfg.corpus).open()]
    queries = [p.get("text", p.get("contents", "")).split(". ")[0][:200] for p in passages][: args.queries]
    kb.search(queries[:8], args.k)  # warm up the encoder

    print(
        f"# KB {cfg.name} ({len(kb)} docs, search={cfg.search}, encoder={cfg.encoder}), {len(queries)} queries, "
        f"k={args.k}, service micro-batch wait {args.max_wait_ms} ms, {args.threads} torch thread(s) per process"
    )
    t0, cpu0 = time.perf_counter(), time.process_time()
    kb.search(queries, args.k)
    secs, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(
        f"# in-process, all {len(queries)} queries in one search call: {len(queries) / secs:.1f} q/s, "
        f"{cpu * 1000 / len(queries):.1f} CPU ms/q (the batching ceiling)"
    )
    print(
        f"{'clients':>7} {'mode':<10} {'q/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'batch':>6} {'CPU ms/q':>7} "
        f"{'q/s ratio':>9} {'p50 ratio':>9} {'CPU ratio':>9}"
    )
    rows = []
    with service_process(args.kb, cfg.name, args.max_wait_ms) as (url, pid):
        measure_service(url, pid, cfg.name, queries[:8], 1, args.k)  # warm up the service's encoder
        for c in args.concurrency:
            rows += measure_pair(kb, url, pid, cfg.name, queries, c, args.k)
    print(
        "# ratios: service / in-process at the same number of clients (q/s > 1, p50 < 1, CPU < 1 favour the service);"
        " CPU ms/q counts the service process and the HTTP clients, so it is robust to a busy machine"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
