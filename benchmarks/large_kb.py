"""Large-KB indexes side by side: FAISS flat, IVF-PQ + refine, HNSW and the Milvus backend; then 1 vs 2 encoders.

Index part, on SYNTHETIC vectors: clustered unit vectors (384-d, a 64-d latent of 500 Gaussian clusters mapped by
one fixed random projection, so recall behaves as on real sentence embeddings, unlike uniform noise). Each index is
built through kbrouter's own code (`retrievers.faiss_index.build_sharded`, `retrievers.milvus.sync_collection`) in
a fresh subprocess, so its peak RSS is its own. Printed per index: build seconds, peak RSS and RSS added over the
raw vectors, bytes on disk, query latency p50/p99 at batch 1 and batch 64, recall@10 against exact search.
Build seconds and latencies are CPU time of the process (all its threads, one FAISS thread): on a machine shared
with other jobs wall time mostly measures the neighbours. Wall build seconds are printed beside them. The Milvus backend runs embedded (Milvus Lite: pure Python, for laptops and tests) at a smaller size,
`--db-n`, with FAISS flat and HNSW at that size beside it for the ratio; a Milvus cluster cannot run here.

Encode part, on REAL text: the first `--encode-texts` passages of the shared corpus (../shared/data/text) encoded
by the real all-MiniLM-L6-v2 in one process and in a 2-process sentence-transformers pool, wall time as a ratio,
and the largest difference between the two sets of vectors.

Run (CPU; threads pinned to 1 per process so figures do not depend on the neighbours' load):

    nice python benchmarks/large_kb.py                       # 200k vectors, DB at 20k, 400 real texts
    nice python benchmarks/large_kb.py --n 1000000 --skip-hnsw --db-n 0 --encode-texts 0   # 1M, FAISS only
    nice python benchmarks/large_kb.py --n 1000000 --db-n 1000000 --encode-texts 100000  # 1M everywhere, whole corpus
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DIM, LATENT, CLUSTERS, CHUNK = 384, 64, 500, 50_000
K = 10
SWEEP = ((64, 4), (128, 4), (128, 10))  # IVF-PQ query settings (nprobe, refine k-factor) also measured


# set by `--vectors-npy` / `--queries-npy` (the real-corpus part): the indexes are built on these instead
REAL: dict[str, np.ndarray] = {}


def vectors(n: int, seed: int = 0, start: int = 0) -> np.ndarray:
    """Rows `start..start+n` of the synthetic corpus (chunk-seeded, so any slice is reproducible), or of the real one."""
    if "vectors" in REAL:  # the IVF training sample (seed 7) is then the corpus itself
        return REAL["vectors"][start : start + n]
    rng = np.random.default_rng(1234)
    proj = rng.standard_normal((LATENT, DIM), dtype=np.float32) / math.sqrt(LATENT)
    centres = rng.standard_normal((CLUSTERS, LATENT), dtype=np.float32)
    out = np.empty((n, DIM), dtype=np.float32)
    for c0 in range(start - start % CHUNK, start + n, CHUNK):
        r = np.random.default_rng([seed, c0])
        z = centres[r.integers(0, CLUSTERS, CHUNK)] + 0.35 * r.standard_normal((CHUNK, LATENT), dtype=np.float32)
        x = z @ proj
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        lo, hi = max(start, c0), min(start + n, c0 + CHUNK)
        out[lo - start : hi - start] = x[lo - c0 : hi - c0]
    return out


def queries(n: int) -> np.ndarray:
    return REAL["queries"][:n] if "queries" in REAL else vectors(n, seed=99)


def encode_real(out: Path) -> tuple[Path, Path]:
    """The whole shared text corpus (passages as the `wiki` KB cuts them) and its questions, encoded by the real
    all-MiniLM-L6-v2 once; saved as .npy so every index child reads the same vectors."""
    import torch

    from retrievers.chunking import passages, read_text_corpus
    from retrievers.encoders import load_encoder

    torch.set_num_threads(1)
    data = ROOT.parent / "shared" / "data" / "text"
    _, texts = passages(list(read_text_corpus(data / "corpus.jsonl")), "wiki")
    questions = [json.loads(line)["question"] for line in (data / "questions.jsonl").open() if line.strip()]
    encoder = load_encoder("minilm", device="cpu")
    t0 = time.perf_counter()
    x = np.asarray(encoder.encode(texts), dtype=np.float32)
    q = np.asarray(encoder.encode(questions), dtype=np.float32)
    print(f"  real corpus: {len(texts)} passages + {len(questions)} questions encoded in {time.perf_counter() - t0:.0f} s "
          f"(1 thread)", flush=True)  # fmt: skip
    paths = out / "corpus.npy", out / "questions.npy"
    np.save(paths[0], x / np.linalg.norm(x, axis=1, keepdims=True))
    np.save(paths[1], q / np.linalg.norm(q, axis=1, keepdims=True))
    return paths


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def disk_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


# CPU time of this process (every thread, the in-process Milvus Lite server's too), not wall time: see the docstring
CLOCK = time.process_time


def latencies(search, q: np.ndarray, singles: int, batches: int) -> dict:
    """CPU ms: p50/p99 over `singles` one-query searches and `batches` 64-query searches."""
    one, many = [], []
    for i in range(singles):
        t0 = CLOCK()
        search(q[i : i + 1])
        one.append((CLOCK() - t0) * 1000)
    for b in range(batches):
        sl = q[(b * 64) % (len(q) - 64) :][:64]
        t0 = CLOCK()
        search(sl)
        many.append((CLOCK() - t0) * 1000)
    return {
        "p50_b1_ms": float(np.percentile(one, 50)),
        "p99_b1_ms": float(np.percentile(one, 99)),
        "p50_b64_ms": float(np.percentile(many, 50)),
        "p99_b64_ms": float(np.percentile(many, 99)),
    }


def recall_at_k(ids: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / K for a, b in zip(ids, truth, strict=True)]))


def exact_ids(n: int, q: np.ndarray) -> np.ndarray:
    import faiss

    index = faiss.IndexFlatIP(DIM)
    for start in range(0, n, CHUNK):
        index.add(vectors(min(CHUNK, n - start), start=start))
    return index.search(q, K)[1]


def run_faiss(kind: str, n: int, args) -> dict:
    import faiss

    from retrievers.faiss_index import IndexSpec, build_sharded, capped_nlist, load_sharded, set_query_params

    faiss.omp_set_num_threads(1)
    q = queries(args.queries)
    nlist = capped_nlist(args.nlist, min(n, args.train))
    spec = {
        "flat": IndexSpec("flat"),
        "hnsw": IndexSpec("hnsw", hnsw_m=32, ef_construction=40, ef_search=64),
        "ivfpq": IndexSpec("ivfpq", nlist=nlist, nprobe=args.nprobe, pq_m=48, refine="flat", refine_k_factor=4),
    }[kind]
    out = Path(tempfile.mkdtemp(prefix=f"large_kb_{kind}_"))
    try:
        sample = vectors(min(n, args.train), seed=7) if spec.needs_training else None
        chunks = [vectors(min(CHUNK, n - i), start=i) for i in range(0, n, CHUNK)]  # made before the clock starts
        base = rss_mb()  # peak so far: the raw vectors, the queries and the exact search
        t0, w0 = CLOCK(), time.perf_counter()
        build_sharded(lambda s: iter(chunks), out, DIM, spec, shard_size=n, train_sample=sample, progress=False)
        build_s, build_wall_s = CLOCK() - t0, time.perf_counter() - w0
        index = load_sharded(out, mmap=kind == "flat")
        lat = latencies(lambda x: index.search(x, K), q, args.singles, args.batches)
        got = index.search(q, K)[1]
        sweep = []  # IVF-PQ: the same built index at more cells visited / a larger refine shortlist
        for nprobe, k_factor in SWEEP if kind == "ivfpq" else ():
            set_query_params(index, replace(spec, nprobe=nprobe, refine_k_factor=k_factor))
            lat_s = latencies(lambda x: index.search(x, K), q, args.singles, args.batches)
            sweep.append({"nprobe": nprobe, "refine_k_factor": k_factor, "got": index.search(q, K)[1], **lat_s})
        size = disk_mb(out)
        peak = rss_mb()
    finally:
        shutil.rmtree(out, ignore_errors=True)
    truth = exact_ids(n, q)  # after the peak is read: its own flat index would count otherwise
    for row in sweep:
        row["recall@10"] = recall_at_k(row.pop("got"), truth)
    label = {
        "flat": "faiss flat",
        "hnsw": "faiss HNSW32 efS64",
        "ivfpq": f"faiss IVF{nlist},PQ48+RFlat np{args.nprobe}",
    }
    return {"index": label[kind], "n": n, "build_s": build_s, "build_wall_s": build_wall_s, "peak_rss_mb": peak, "added_rss_mb": peak - base,
            "disk_mb": size, "recall@10": recall_at_k(got, truth), **lat, **({"sweep": sweep} if sweep else {})}  # fmt: skip


def run_milvus(n: int, args) -> dict:
    """The kbrouter Milvus backend (Milvus Lite, HNSW M32) filled by `sync_collection`, searched through pymilvus."""
    from retrievers import milvus
    from retrievers.config import KBConfig
    from retrievers.encoders import Encoder
    from retrievers.types import Doc

    q = queries(args.queries)
    x = vectors(n)
    base = rss_mb()
    tmp = Path(tempfile.mkdtemp(prefix="large_kb_milvus_"))
    try:
        corpus = tmp / "c.jsonl"
        corpus.write_text("{}\n")
        cfg = KBConfig(name="bench", kind="text", corpus=corpus, search="dense", index="milvus", index_dir=tmp / "idx",
                       uri=str(tmp / "bench.db"), build_chunk=5000, options={"milvus_index": "HNSW"})  # fmt: skip
        docs = [Doc(id=str(i), text=f"passage {i}") for i in range(n)]
        texts = [str(i) for i in range(n)]  # the "encoder" looks the vector up by row number

        def encode(batch: list[str]) -> np.ndarray:
            return x[np.asarray(batch, dtype=np.int64)]

        t0, w0 = CLOCK(), time.perf_counter()
        milvus.sync_collection(cfg, docs, texts, [d.text for d in docs], None, Encoder("synthetic", DIM, encode),
                               encode, progress=False)  # fmt: skip
        client = milvus.connect(cfg.uri)
        client.load_collection(cfg.collection)
        build_s, build_wall_s = CLOCK() - t0, time.perf_counter() - w0
        params = {"metric_type": "IP", "params": {"ef": 64}}

        def search(v: np.ndarray):
            return client.search(cfg.collection, data=v.tolist(), anns_field="vector", limit=K, search_params=params)

        lat = latencies(search, q, args.singles, args.batches)
        got = np.asarray([[int(h["id"]) for h in hits] for hits in search(q)])
        peak = rss_mb()
        milvus.close_all()
        size = disk_mb(tmp / "bench.db")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    truth = exact_ids(n, q)
    return {"index": "milvus lite HNSW32 ef64", "n": n, "build_s": build_s, "build_wall_s": build_wall_s,
            "peak_rss_mb": peak,
            "added_rss_mb": peak - base, "disk_mb": size, "recall@10": recall_at_k(got, truth), **lat}  # fmt: skip


def run_encode(n_texts: int) -> dict:
    """Real MiniLM on the first `n_texts` shared passages: 1 process (1 thread) vs a 2-process pool."""
    import torch

    from retrievers.chunking import passages, read_text_corpus
    from retrievers.encoders import encoding_pool, load_encoder

    torch.set_num_threads(1)
    corpus = ROOT.parent / "shared" / "data" / "text" / "corpus.jsonl"
    _, texts = passages(list(read_text_corpus(corpus)), "wiki")
    texts = texts[:n_texts]
    encoder = load_encoder("minilm", device="cpu")
    encoder.encode(texts[:64])  # warm-up
    t0, c0 = time.perf_counter(), time.process_time()
    one = encoder.encode(texts)
    one_s, one_cpu = time.perf_counter() - t0, time.process_time() - c0
    with encoding_pool(encoder, workers=2, device="cpu") as encode:
        encode(texts[:64])  # warm-up: the workers load their model copies
        t0 = time.perf_counter()
        two = encode(texts)
        two_s = time.perf_counter() - t0
    workers_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)  # the pool's processes, after they stopped
    return {"texts": len(texts), "one_worker_s": one_s, "two_workers_s": two_s, "one_worker_cpu_s": one_cpu,
            "pool_cpu_s_incl_model_load": workers_cpu.ru_utime + workers_cpu.ru_stime,
            "texts_per_s_1": len(texts) / one_s, "texts_per_s_2": len(texts) / two_s,
            "speedup_2_over_1": one_s / two_s, "max_abs_diff": float(np.abs(one - two).max())}  # fmt: skip


def child(what: str, n: int, args) -> None:
    if what == "milvus":
        result = run_milvus(n, args)
    elif what == "encode":
        result = run_encode(n)
    else:
        result = run_faiss(what, n, args)
    print("RESULT " + json.dumps(result))


def spawn(what: str, n: int, args, real: tuple[Path, Path] | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child", what, "--child-n", str(n)]
    if real:
        cmd += ["--vectors-npy", str(real[0]), "--queries-npy", str(real[1])]
    cmd += ["--queries", str(args.queries), "--singles", str(args.singles), "--batches", str(args.batches)]
    cmd += ["--nlist", str(args.nlist), "--nprobe", str(args.nprobe), "--train", str(args.train)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode or not lines:  # report it and go on: one broken index must not lose the others' figures
        print(f"  FAILED: {what} at n={n}:\n{out.stderr[-3000:]}", flush=True)
        return None
    print(f"  {lines[-1]}", flush=True)  # each figure as soon as it is measured
    return json.loads(lines[-1][len("RESULT ") :])


def sweep_lines(rows: list[dict]) -> None:
    for r in rows:
        for s in r.get("sweep", []):
            print(f"  {r['index']} at nprobe {s['nprobe']}, refine k-factor {s['refine_k_factor']}: recall@10 "
                  f"{s['recall@10']:.3f}, p50/p99 batch 1 {s['p50_b1_ms']:.1f}/{s['p99_b1_ms']:.1f} ms, "
                  f"batch 64 {s['p50_b64_ms']:.1f}/{s['p99_b64_ms']:.1f} ms")  # fmt: skip


def table(rows: list[dict]) -> None:
    cols = ["index", "n", "build_s", "build_wall_s", "peak_rss_mb", "added_rss_mb", "disk_mb", "p50_b1_ms", "p99_b1_ms",
            "p50_b64_ms", "p99_b64_ms", "recall@10"]  # fmt: skip
    cells = [[r["index"], str(r["n"])] + [f"{r[c]:.3f}" if c == "recall@10" else f"{r[c]:.1f}" for c in cols[2:]]
             for r in rows]  # fmt: skip
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    for row in [cols, *cells]:
        print("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200_000, help="synthetic vectors for the FAISS indexes (0: skip)")
    parser.add_argument("--db-n", type=int, default=20_000, help="vectors for the Milvus Lite backend (0: skip)")
    parser.add_argument("--encode-texts", type=int, default=400, help="real passages to encode (0: skip)")
    parser.add_argument("--skip-hnsw", action="store_true", help="HNSW at --n takes minutes on one core")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--singles", type=int, default=100, help="batch-1 searches timed")
    parser.add_argument("--batches", type=int, default=20, help="batch-64 searches timed")
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument("--nprobe", type=int, default=32)
    parser.add_argument("--train", type=int, default=100_000, help="IVF training sample")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--real-corpus", action="store_true",
                        help="also build and query every index on the real shared corpus, encoded by MiniLM")  # fmt: skip
    parser.add_argument("--vectors-npy", help=argparse.SUPPRESS)
    parser.add_argument("--queries-npy", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.vectors_npy:
            REAL.update(vectors=np.load(args.vectors_npy), queries=np.load(args.queries_npy))
        child(args.child, args.child_n, args)
        return 0
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    raw_mb = args.n * DIM * 4 / 2**20
    print(f"index part: {args.n:,} synthetic 384-d unit vectors ({raw_mb:.0f} MB as float32), {args.queries} queries")
    # the quick parts first, so a run cut short still has them; with --db-n equal to --n the database runs last, at
    # full size, beside the big FAISS rows (no second flat and HNSW build of the same vectors)
    same = args.db_n == args.n and not args.skip_hnsw
    small = [spawn(kind, args.db_n, args) for kind in ("flat", "hnsw", "milvus")] if args.db_n and not same else []
    enc = spawn("encode", args.encode_texts, args) if args.encode_texts else None
    kinds = ("flat", "ivfpq") + (() if args.skip_hnsw else ("hnsw",))
    big = [spawn(kind, args.n, args) for kind in kinds] if args.n else []
    if same and args.n:
        by_kind = dict(zip(kinds, big, strict=True))
        small = [by_kind["flat"], by_kind["hnsw"], spawn("milvus", args.db_n, args)]
    big, small = [r for r in big if r], [r for r in small if r]
    real = []
    if args.real_corpus:
        tmp = Path(tempfile.mkdtemp(prefix="large_kb_real_"))
        try:
            paths = encode_real(tmp)
            n_real, n_q = len(np.load(paths[0], mmap_mode="r")), len(np.load(paths[1], mmap_mode="r"))
            real_args = argparse.Namespace(**{**vars(args), "queries": min(args.queries, n_q)})
            real = [spawn(kind, n_real, real_args, paths) for kind in ("flat", "ivfpq", "hnsw", "milvus")]
            real = [r for r in real if r]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if big:
        print(f"\n== {args.n:,} vectors ==")
        table(big)
        sweep_lines(big)
    if small:
        print(f"\n== {args.db_n:,} vectors: the Milvus backend (embedded Milvus Lite) beside FAISS ==")
        table(small)
    if len(small) == 3:
        flat, hnsw, db = small
        print(f"milvus lite / faiss flat: build x{db['build_s'] / max(flat['build_s'], 1e-9):.0f}, "
              f"p50 batch-1 x{db['p50_b1_ms'] / flat['p50_b1_ms']:.1f}, "
              f"p50 batch-64 x{db['p50_b64_ms'] / flat['p50_b64_ms']:.1f}; "
              f"milvus lite / faiss HNSW p50 batch-1 x{db['p50_b1_ms'] / hnsw['p50_b1_ms']:.1f}")  # fmt: skip
    if real:
        print(
            f"\n== the real shared corpus: {real[0]['n']:,} MiniLM passage vectors, queried by its real questions =="
        )
        table(real)
        sweep_lines(real)
    per_vec = {r["index"]: r["disk_mb"] * 2**20 / r["n"] for r in big + small}
    print("\nbytes per vector on disk: " + ", ".join(f"{k} {v:.0f}" for k, v in per_vec.items()))
    if enc:
        print(
            f"\n== encoding {enc['texts']} real shared passages with all-MiniLM-L6-v2 (CPU, 1 thread per process) =="
        )
        print(f"1 worker {enc['one_worker_s']:.1f}s ({enc['texts_per_s_1']:.1f} texts/s), 2 workers "
              f"{enc['two_workers_s']:.1f}s ({enc['texts_per_s_2']:.1f} texts/s): 2/1 speed-up "
              f"x{enc['speedup_2_over_1']:.2f} (wall); max |v1 - v2| = {enc['max_abs_diff']:.1e}")  # fmt: skip
        print(f"CPU seconds: 1 worker {enc['one_worker_cpu_s']:.1f}; the 2 pool processes "
              f"{enc['pool_cpu_s_incl_model_load']:.1f} (with their model loading and warm-up)")  # fmt: skip
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps({"big": big, "small": small, "encode": enc, "real": real}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
