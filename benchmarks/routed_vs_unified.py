"""Routed retrieval (search one KB of N vectors) against one unified index over all 5 KBs (5N vectors).

kbrouter routes each sub-question to one KB; the alternative is one index holding every modality. This script
measures both, for exact (flat) and approximate (HNSW, IVF / IVF-PQ) FAISS indexes, at several N, and prints
latency per query with the unified/routed ratio, plus recall@10 of the approximate indexes against exact search.

Data: SYNTHETIC clustered unit vectors, not real embeddings. Each KB has its own 200 cluster centres in a
64-d latent space (points = centre + Gaussian noise), mapped to 384-d by one fixed random projection and
L2-normalised, so the data has the low intrinsic dimension of real sentence embeddings (uniform random vectors
make ANN recall meaningless, see notes/env-probe.md §4). Queries are drawn from KB 0's distribution (the KB a
router would pick). Vectors are generated chunk by chunk from fixed seeds; a unified index too large for RAM as
float32 is searched exactly as streamed per-KB flat shards merged by top-k (the same arithmetic as one flat
index) and approximately as one IVF-PQ index.

Latencies are CPU time with one FAISS thread, so they hold on a shared machine. HNSW is built only up to
--hnsw-max (HNSW over 1M vectors takes ~7 min to build on 2 cores); IVF is built at every size, as IVF-PQ
(no refinement, so recall drops) once the unified index would exceed --pq-above rows.

Run (CPU; on 2 cores shared with other jobs, 10k-100k took ~13 min wall and the 1M size alone ~12.5 min):

    nice python benchmarks/routed_vs_unified.py
    nice python benchmarks/routed_vs_unified.py --sizes 10000 100000 --hnsw-max 100000   # quicker / more HNSW
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from retrievers.faiss_index import IndexSpec, make_index, set_query_params, train_index

N_KBS = 5
LATENT = 64
CHUNK = 100_000


class Synthetic:
    """Deterministic clustered vectors: `rows(kb, start, n)` always returns the same rows."""

    def __init__(self, dim: int, clusters: int, noise: float, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.dim, self.noise, self.seed = dim, noise, seed
        self.proj = rng.standard_normal((LATENT, dim), dtype=np.float32) / math.sqrt(LATENT)
        self.centres = [rng.standard_normal((clusters, LATENT), dtype=np.float32) for _ in range(N_KBS)]

    def _make(self, kb: int, n: int, rng: np.random.Generator) -> np.ndarray:
        c = self.centres[kb][rng.integers(0, len(self.centres[kb]), n)]
        z = c + self.noise * rng.standard_normal((n, LATENT), dtype=np.float32)
        x = z @ self.proj
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    def rows(self, kb: int, start: int, n: int) -> np.ndarray:
        out = np.empty((n, self.dim), dtype=np.float32)  # filled in place: no second copy at 1M rows
        for c0 in range(start - start % CHUNK, start + n, CHUNK):
            block = self._make(kb, CHUNK, np.random.default_rng([self.seed, kb, c0]))
            lo, hi = max(start, c0) - c0, min(start + n, c0 + CHUNK) - c0
            out[c0 + lo - start : c0 + hi - start] = block[lo:hi]
        return out

    def add_to(self, index, kb: int, n: int) -> None:
        """Add KB `kb`'s first `n` rows to `index` chunk by chunk (bounded memory)."""
        for start in range(0, n, CHUNK):
            index.add(self.rows(kb, start, min(CHUNK, n - start)))

    def queries(self, n: int) -> np.ndarray:
        return self._make(0, n, np.random.default_rng([self.seed, 999]))


# CPU time of this process, not wall time: on a shared machine wall time mostly measures the neighbours. With
# one FAISS thread (the default) CPU time is the search's own work.
CLOCK = time.process_time


def timed_search(index, q: np.ndarray, k: int, singles: int) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """(scores, ids, batch ms/query, per-query ms for the first `singles` queries searched one at a time)."""
    t0 = CLOCK()
    s, i = index.search(q, k)
    batch_ms = (CLOCK() - t0) * 1000 / len(q)
    single = []
    for j in range(singles):
        t0 = CLOCK()
        index.search(q[j : j + 1], k)
        single.append((CLOCK() - t0) * 1000)
    return s, i, batch_ms, np.asarray(single)


def recall(ids: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(ids, truth, strict=True)]))


def ivf_spec(n: int, n_per_kb: int, args) -> IndexSpec:
    """IVF over `n` rows; IVF-PQ for routed and unified alike once the unified index (5N) passes --pq-above."""
    nlist = int(min(args.max_nlist, max(16, 4 * math.sqrt(n))))
    kind = "ivfpq" if N_KBS * n_per_kb > args.pq_above else "ivf"
    return IndexSpec(kind=kind, nlist=nlist, nprobe=args.nprobe, pq_m=args.pq_m)


def build_ivf(data: Synthetic, kbs: list[int], n: int, spec: IndexSpec):
    """IVF(-PQ) over `n` rows of each KB in `kbs`, trained on a mixed sample, added chunk by chunk."""
    per = max(1, min(n, 40 * spec.nlist // len(kbs)))
    sample = np.concatenate([data.rows(kb, 0, per) for kb in kbs])
    index = make_index(data.dim, spec)
    t0 = time.perf_counter()
    train_index(index, sample)
    for kb in kbs:
        data.add_to(index, kb, n)
    set_query_params(index, spec)
    return index, time.perf_counter() - t0


def run_size(n: int, data: Synthetic, q: np.ndarray, args) -> list[dict]:
    import faiss

    rows, k, singles = [], args.k, args.singles
    # -- exact, routed: one KB in RAM
    flat0 = faiss.IndexFlatIP(data.dim)
    data.add_to(flat0, 0, n)
    x0 = data.rows(0, 0, n) if n <= args.hnsw_max or N_KBS * n <= args.max_unified_flat else None
    _, gt_r, b_r, s_r = timed_search(flat0, q, k, singles)
    # -- exact, unified: one flat index when it fits, else per-KB flat shards merged (streamed; same arithmetic)
    if N_KBS * n <= args.max_unified_flat:
        xu = np.concatenate([x0] + [data.rows(kb, 0, n) for kb in range(1, N_KBS)])
        flatu = faiss.IndexFlatIP(data.dim)
        flatu.add(xu)
        _, gt_u, b_u, s_u = timed_search(flatu, q, k, singles)
        exact_u_label = "flat"
        del flatu
    else:
        xu = None
        parts_s, parts_i, b_u, s_u = [], [], 0.0, np.zeros(singles)
        for kb in range(N_KBS):
            shard = flat0 if kb == 0 else faiss.IndexFlatIP(data.dim)
            if kb:
                data.add_to(shard, kb, n)
            s, i, b, s1 = timed_search(shard, q, k, singles)
            parts_s.append(s)
            parts_i.append(np.where(i >= 0, i + kb * n, -1))
            b_u, s_u = b_u + b, s_u + s1
            del shard
        t0 = CLOCK()
        heap = faiss.ResultHeap(len(q), k, keep_max=True)  # FAISS's own top-k merge (inner product: keep max)
        for s, i in zip(parts_s, parts_i, strict=True):
            heap.add_result(s, i)
        heap.finalize()
        gt_u = heap.I
        b_u += (CLOCK() - t0) * 1000 / len(q)
        exact_u_label = "flat (5 streamed shards)"
    rows.append(
        {
            "N": n,
            "index": "exact",
            "unified_index": exact_u_label,
            "routed_ms": b_r,
            "unified_ms": b_u,
            "routed_p50_1q_ms": float(np.median(s_r)),
            "unified_p50_1q_ms": float(np.median(s_u)),
            "recall_routed": 1.0,
            "recall_unified": 1.0,
        }
    )
    del flat0
    # -- HNSW (small N only: building over 1M takes ~7 min on 2 cores)
    if n <= args.hnsw_max:
        if xu is None:
            xu = np.concatenate([x0] + [data.rows(kb, 0, n) for kb in range(1, N_KBS)])
        spec = IndexSpec(
            kind="hnsw", hnsw_m=args.hnsw_m, ef_construction=args.ef_construction, ef_search=args.ef_search
        )
        res = {}
        for name, x in (("routed", x0), ("unified", xu)):
            index = make_index(data.dim, spec)
            t0 = time.perf_counter()
            index.add(x)
            build_s = time.perf_counter() - t0
            set_query_params(index, spec)
            _, ids, b, s1 = timed_search(index, q, k, singles)
            res[name] = (b, s1, recall(ids, gt_r if name == "routed" else gt_u), build_s)
        rows.append(_row(n, f"hnsw M{args.hnsw_m} efS{args.ef_search}", res))
    del xu, x0
    # -- IVF (IVF-PQ above --pq-above rows, where IVF-Flat would not fit in RAM)
    res = {}
    for name, kbs in (("routed", [0]), ("unified", list(range(N_KBS)))):
        spec = ivf_spec(n * len(kbs), n, args)
        index, build_s = build_ivf(data, kbs, n, spec)
        _, ids, b, s1 = timed_search(index, q, k, singles)
        res[name] = (b, s1, recall(ids, gt_r if name == "routed" else gt_u), build_s, spec)
        del index
    r_spec, u_spec = res["routed"][4], res["unified"][4]
    label = f"{r_spec.kind}{r_spec.nlist}|{u_spec.kind}{u_spec.nlist} np{args.nprobe}"
    rows.append(_row(n, label, res))
    return rows


def _row(n: int, label: str, res: dict) -> dict:
    return {
        "N": n,
        "index": label,
        "routed_ms": res["routed"][0],
        "unified_ms": res["unified"][0],
        "routed_p50_1q_ms": float(np.median(res["routed"][1])),
        "unified_p50_1q_ms": float(np.median(res["unified"][1])),
        "recall_routed": res["routed"][2],
        "recall_unified": res["unified"][2],
        "build_s_routed": round(res["routed"][3], 1),
        "build_s_unified": round(res["unified"][3], 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[10_000, 20_000, 100_000, 1_000_000],
        help="vectors per KB (N); the unified index holds 5N",
    )
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--singles", type=int, default=20, help="queries also timed one at a time (p50)")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--clusters", type=int, default=200, help="cluster centres per KB")
    parser.add_argument("--noise", type=float, default=0.35)
    parser.add_argument("--hnsw-max", type=int, default=20_000, help="build HNSW only for N up to this")
    parser.add_argument("--hnsw-m", type=int, default=32)
    parser.add_argument("--ef-construction", type=int, default=40)
    parser.add_argument("--ef-search", type=int, default=64)
    parser.add_argument("--max-nlist", type=int, default=1024)
    parser.add_argument("--nprobe", type=int, default=16)
    parser.add_argument(
        "--pq-above",
        type=int,
        default=1_000_000,
        help="IVF-PQ instead of IVF-Flat (routed and unified) when the unified index has more rows",
    )
    parser.add_argument("--pq-m", type=int, default=48)
    parser.add_argument(
        "--max-unified-flat",
        type=int,
        default=1_000_000,
        help="largest unified exact index held in RAM as one flat index",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="FAISS OpenMP threads (1 keeps timings stable on a shared machine)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)

    import faiss

    faiss.omp_set_num_threads(args.threads)
    data = Synthetic(args.dim, args.clusters, args.noise, args.seed)
    q = data.queries(args.queries)
    print(
        f"# routed (1 KB of N) vs unified (5 KBs, 5N) | synthetic clustered unit vectors, dim {args.dim}, "
        f"{args.queries} queries from KB 0, k={args.k}, faiss {faiss.__version__}, {faiss.omp_get_max_threads()} "
        f"threads"
    )
    print(
        f"# ms = CPU ms per query with {args.threads} FAISS thread(s) (batch: all queries in one call; 1q p50: median "
        "of single-query calls); ratio = unified / routed"
    )
    header = (
        f"{'N':>9} {'index':<24} {'routed ms':>9} {'unified ms':>10} {'ratio':>6} {'routed 1q':>9} "
        f"{'unified 1q':>10} {'ratio':>6} {'R@10 rt':>7} {'R@10 un':>7}"
    )
    print(header)
    all_rows = []
    t_start = time.perf_counter()
    for n in args.sizes:
        for r in run_size(n, data, q, args):
            all_rows.append(r)
            print(
                f"{r['N']:>9} {r['index'][:24]:<24} {r['routed_ms']:>9.3f} {r['unified_ms']:>10.3f} "
                f"{r['unified_ms'] / r['routed_ms']:>6.2f} {r['routed_p50_1q_ms']:>9.3f} "
                f"{r['unified_p50_1q_ms']:>10.3f} {r['unified_p50_1q_ms'] / r['routed_p50_1q_ms']:>6.2f} "
                f"{r['recall_routed']:>7.3f} {r['recall_unified']:>7.3f}",
                flush=True,
            )
    print(
        f"# total {time.perf_counter() - t_start:.0f}s; exact-unified rows above {args.max_unified_flat} vectors "
        "are 5 flat shards searched in turn and merged"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
