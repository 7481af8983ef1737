"""Large local indexes on real FAISS: factory-made kinds, sharded chunked builds (faiss.IndexShards), resume,
mmap, recall, query-time parameters."""

from __future__ import annotations

import json

import faiss
import numpy as np
import pytest

from retrievers.faiss_index import PROGRESS_FILE, IndexSpec, build_sharded, load_sharded, make_index

DIM = 64


def clustered(n: int, seed: int = 0, dim: int = DIM) -> np.ndarray:
    """Unit vectors around 40 centres with a 16-d latent (real embeddings are clustered; uniform noise is not)."""
    rng = np.random.default_rng(seed)
    proj = np.random.default_rng(123).standard_normal((16, dim)).astype(np.float32)
    centres = np.random.default_rng(7).standard_normal((40, 16)).astype(np.float32)
    z = centres[rng.integers(0, 40, n)] + 0.4 * rng.standard_normal((n, 16)).astype(np.float32)
    x = z @ proj
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


X = clustered(6000)
Q = clustered(50, seed=1)


def source(x: np.ndarray, chunk: int, starts: list[int] | None = None, fail_after: int | None = None):
    """A restartable chunk source over `x` that records where it was asked to start and can fail midway."""

    def chunks_from(start: int):
        if starts is not None:
            starts.append(start)
        for n, i in enumerate(range(start, len(x), chunk)):
            if fail_after is not None and n == fail_after:
                raise RuntimeError("simulated crash")
            yield x[i : i + chunk]

    return chunks_from


def exact(x: np.ndarray, q: np.ndarray, k: int):
    index = make_index(x.shape[1], IndexSpec("flat"))
    index.add(x)
    return index.search(q, k)


def test_sharded_flat_equals_one_flat_index(tmp_path):
    manifest = build_sharded(source(X, 700), tmp_path / "idx", DIM, IndexSpec("flat"), shard_size=2500, progress=False)
    # 6000 rows in shards of 2500 -> 2500, 2500, 1000, with global offsets
    assert [(s["offset"], s["ntotal"]) for s in manifest["shards"]] == [(0, 2500), (2500, 2500), (5000, 1000)]
    index = load_sharded(tmp_path / "idx")
    assert isinstance(index, faiss.IndexShards)  # FAISS merges the shards' answers, with global ids
    s, i = index.search(Q, 10)
    want_s, want_i = exact(X, Q, 10)
    assert index.ntotal == len(X)
    np.testing.assert_array_equal(i, want_i)
    np.testing.assert_allclose(s, want_s, rtol=1e-6)


def test_interrupted_build_resumes_where_it_stopped(tmp_path):
    out = tmp_path / "idx"
    with pytest.raises(RuntimeError, match="simulated crash"):
        # chunks of 500, shard of 1000: the crash after 5 chunks leaves 2 finished shards (2000 rows)
        build_sharded(source(X, 500, fail_after=5), out, DIM, IndexSpec("flat"), shard_size=1000, progress=False)
    state = json.loads((out / PROGRESS_FILE).read_text())
    assert state["rows_done"] == 2000 and len(state["shards"]) == 2
    with pytest.raises(FileNotFoundError, match="unfinished"):
        load_sharded(out)
    starts: list[int] = []
    build_sharded(source(X, 500, starts=starts), out, DIM, IndexSpec("flat"), shard_size=1000, progress=False)
    assert starts == [2000]  # resumed, not restarted
    s, i = load_sharded(out).search(Q, 10)
    np.testing.assert_array_equal(i, exact(X, Q, 10)[1])
    # a finished build is reused as is; a different spec in the same folder is refused
    again = build_sharded(source(X, 500, starts=starts), out, DIM, IndexSpec("flat"), 1000, progress=False)
    assert starts == [2000] and again["ntotal"] == len(X)  # not a row read: the finished manifest comes back
    with pytest.raises(ValueError, match="another spec"):
        build_sharded(source(X, 500), out, DIM, IndexSpec("hnsw"), 1000, progress=False)


@pytest.mark.parametrize(
    "spec,min_recall",
    [
        # HNSW over 2 shards, default efSearch
        (IndexSpec("hnsw", hnsw_m=16, ef_construction=40, ef_search=64), 0.9),
        # IVF-Flat visiting 8 of 32 cells
        (IndexSpec("ivf", nlist=32, nprobe=8), 0.85),
        # IVF-PQ: 16 sub-quantizers of 6 bits compress 256 bytes to 12, so recall is lower
        (IndexSpec("ivfpq", nlist=32, nprobe=8, pq_m=16, pq_bits=6), 0.4),
        # the same codes re-ranked by exact distances over 4x the candidates (IndexRefineFlat) recover recall
        (IndexSpec("ivfpq", nlist=32, nprobe=8, pq_m=16, pq_bits=6, refine="flat", refine_k_factor=4), 0.8),
        # 4-bit codes use FAISS's fast-scan kernels
        (IndexSpec("ivfpq", nlist=32, nprobe=8, pq_m=16, pq_bits=4, refine="fp16"), 0.8),
    ],
)
def test_approximate_indexes_recall_and_mmap(tmp_path, spec, min_recall):
    build_sharded(source(X, 1000), tmp_path / "idx", DIM, spec, shard_size=3000, train_sample=X[:3000], progress=False)
    _, truth = exact(X, Q, 10)
    _, ids = load_sharded(tmp_path / "idx").search(Q, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, truth, strict=True)])
    assert recall >= min_recall, recall
    # memory-mapped shards answer exactly as shards read into RAM
    _, mm_ids = load_sharded(tmp_path / "idx", mmap=True).search(Q, 10)
    np.testing.assert_array_equal(mm_ids, ids)


def test_query_time_overrides_change_ivf_results(tmp_path):
    build_sharded(
        source(X, 1000),
        tmp_path / "idx",
        DIM,
        IndexSpec("ivf", nlist=32, nprobe=1),
        shard_size=6000,
        train_sample=X,
        progress=False,
    )
    _, truth = exact(X, Q, 10)

    def recall(nprobe):
        _, ids = load_sharded(tmp_path / "idx", nprobe=nprobe).search(Q, 10)
        return np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, truth, strict=True)])

    # probing every cell is exact; probing one is not
    assert recall(32) == 1.0
    assert recall(1) < 1.0


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"kind": "annoy"}, ValueError, "unknown"),  # unknown kind names the valid ones
        ({"kind": "ivf", "nlist": 0}, ValueError, "nlist"),  # non-positive parameter
        ({"kind": "ivfpq", "refine": "pq"}, ValueError, "refine"),  # unknown refine store
        ({"kind": "hnsw", "refine": "flat"}, ValueError, "for kind ivfpq"),  # refine re-ranks PQ codes only
    ],
)
def test_spec_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        IndexSpec(**kwargs)


def test_build_errors(tmp_path):
    # IVF without training data says what to pass
    with pytest.raises(ValueError, match="train_sample"):
        build_sharded(source(X, 1000), tmp_path / "a", DIM, IndexSpec("ivf", nlist=8), progress=False)
    # PQ sub-quantizers must divide the dimension
    with pytest.raises(ValueError, match="pq_m"):
        make_index(DIM, IndexSpec("ivfpq", pq_m=48))
    # chunks of the wrong width are refused
    with pytest.raises(ValueError, match=r"expected \(n, 32\)"):
        build_sharded(source(X, 1000), tmp_path / "b", 32, IndexSpec("flat"), progress=False)


def test_query_params_reach_every_shard(tmp_path):
    # nprobe set through faiss.ParameterSpace on the IndexShards reaches each IVF shard
    spec = IndexSpec("ivf", nlist=16, nprobe=3)
    build_sharded(source(X, 1000), tmp_path / "idx", DIM, spec, shard_size=2000, train_sample=X, progress=False)
    index = load_sharded(tmp_path / "idx", nprobe=5)
    assert [faiss.extract_index_ivf(index.at(i)).nprobe for i in range(index.count())] == [5, 5, 5]


def test_sharded_index_drops_into_dense_search(tmp_path):
    # the text KB's `dense_search(index, vectors, k)` takes the IndexShards like one FAISS index
    from retrievers.dense import dense_search

    build_sharded(source(X, 1000), tmp_path / "idx", DIM, IndexSpec("flat"), shard_size=2000, progress=False)
    s, i = dense_search(load_sharded(tmp_path / "idx"), Q, 7)
    want_s, want_i = exact(X, Q, 7)
    np.testing.assert_array_equal(i, want_i)
    np.testing.assert_allclose(s, want_s, rtol=1e-6)
