"""Large FAISS indexes: chunked (bounded-memory) builds that resume, sharded files searched together, mmap, GPU.

An index too large to build in one go is built from an iterator of embedding chunks into a folder of shards::

    spec = IndexSpec(kind="ivfpq", nlist=4096, pq_m=48)
    build_sharded(lambda start: embedding_chunks(corpus, start), out_dir, dim=384, spec=spec,
                  shard_size=1_000_000, train_sample=sample)     # re-running it resumes an interrupted build
    index = ShardedIndex.load(out_dir, mmap=True, nprobe=32)
    scores, ids = index.search(query_vectors, k=10)               # global row ids, best first

Only one chunk and one open shard are in memory while building. `progress.json` records the rows already
committed to finished shards; `shards.json` is written last, so a folder without it is an unfinished build.
All indexes use inner product over L2-normalised vectors.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

INDEX_KINDS = ("flat", "hnsw", "ivf", "ivfpq")
PROGRESS_FILE = "progress.json"
MANIFEST_FILE = "shards.json"
TRAINED_FILE = "trained.faiss"
_GPU_RESOURCES = None
# Yields float32 (n, dim) embedding chunks starting at corpus row `start` (so an interrupted build can resume).
ChunkSource = Callable[[int], Iterator[np.ndarray]]


def _faiss():
    try:
        import faiss
    except ImportError as e:
        raise ImportError("large indexes need FAISS: pip install faiss-cpu (or faiss-gpu on CUDA machines)") from e
    return faiss


@dataclass(frozen=True)
class IndexSpec:
    """Which FAISS index to build and its parameters (build-time ones change the files; query-time ones do not)."""

    kind: str = field(default="flat", metadata={"help": "flat | hnsw | ivf | ivfpq"})
    hnsw_m: int = field(default=32, metadata={"help": "HNSW graph degree (build)."})
    ef_construction: int = field(default=40, metadata={"help": "HNSW efConstruction (build)."})
    ef_search: int = field(default=64, metadata={"help": "HNSW efSearch (query)."})
    nlist: int = field(default=1024, metadata={"help": "IVF cells (build; needs >= 39 training points each)."})
    nprobe: int = field(default=16, metadata={"help": "IVF cells visited per query (query)."})
    pq_m: int = field(default=48, metadata={"help": "IVF-PQ sub-quantizers (build; must divide dim)."})
    pq_bits: int = field(default=8, metadata={"help": "IVF-PQ bits per code (build)."})

    def __post_init__(self) -> None:
        if self.kind not in INDEX_KINDS:
            raise ValueError(f"IndexSpec `kind` {self.kind!r} is unknown; use one of {', '.join(INDEX_KINDS)}")
        for key in ("hnsw_m", "ef_construction", "ef_search", "nlist", "nprobe", "pq_m", "pq_bits"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"IndexSpec `{key}` must be a positive integer, got {value!r}")

    @property
    def needs_training(self) -> bool:
        return self.kind in ("ivf", "ivfpq")


def make_index(dim: int, spec: IndexSpec):
    """An empty (untrained) inner-product index of `spec.kind`."""
    faiss = _faiss()
    if spec.kind == "flat":
        return faiss.IndexFlatIP(dim)
    if spec.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = spec.ef_construction
        return index
    quantizer = faiss.IndexFlatIP(dim)
    if spec.kind == "ivf":
        return faiss.IndexIVFFlat(quantizer, dim, spec.nlist, faiss.METRIC_INNER_PRODUCT)
    if dim % spec.pq_m:
        raise ValueError(f"IndexSpec `pq_m` ({spec.pq_m}) must divide the dimension {dim}; e.g. pq_m: {dim // 8}")
    return faiss.IndexIVFPQ(quantizer, dim, spec.nlist, spec.pq_m, spec.pq_bits, faiss.METRIC_INNER_PRODUCT)


def set_query_params(index, spec: IndexSpec) -> None:
    """Apply the query-time parameters (HNSW efSearch, IVF nprobe) to a loaded index."""
    faiss = _faiss()
    if isinstance(index, faiss.IndexHNSW):
        index.hnsw.efSearch = spec.ef_search
    elif isinstance(index, faiss.IndexIVF):
        index.nprobe = spec.nprobe


def train_index(index, sample: np.ndarray) -> None:
    """Train an IVF/IVF-PQ index on a sample of the corpus vectors (a no-op for flat and HNSW)."""
    if index.is_trained:
        return
    x = np.ascontiguousarray(sample, dtype=np.float32)
    if len(x) < 39 * index.nlist:
        logger.warning("training %d cells on %d vectors; FAISS wants >= %d", index.nlist, len(x), 39 * index.nlist)
    index.train(x)


def add_in_chunks(index, chunks: Iterator[np.ndarray]) -> int:
    """Add embedding chunks to an index one at a time (memory: one chunk); returns the rows added."""
    n = 0
    for chunk in chunks:
        index.add(np.ascontiguousarray(chunk, dtype=np.float32))
        n += len(chunk)
    return n


def gpu_available() -> bool:
    """True when the installed FAISS has GPU support and sees a GPU."""
    faiss = _faiss()
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def to_gpu(index, device: int = 0):
    """Move an index to GPU `device` when GPU FAISS and a GPU are present; otherwise return it unchanged.

    HNSW has no GPU implementation in FAISS and stays on the CPU.
    """
    faiss = _faiss()
    if not gpu_available() or isinstance(index, faiss.IndexHNSW):
        return index
    global _GPU_RESOURCES
    if _GPU_RESOURCES is None:  # one StandardGpuResources per process; each holds scratch memory
        _GPU_RESOURCES = faiss.StandardGpuResources()
    return faiss.index_cpu_to_gpu(_GPU_RESOURCES, device, index)


def to_cpu(index):
    """A CPU copy of a GPU index (for writing); CPU indexes are returned unchanged."""
    faiss = _faiss()
    if gpu_available() and isinstance(index, faiss.GpuIndex):
        return faiss.index_gpu_to_cpu(index)
    return index


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def _write_index(index, path: Path) -> None:
    faiss = _faiss()
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    faiss.write_index(to_cpu(index), str(tmp))
    tmp.replace(path)


def shard_name(i: int) -> str:
    return f"shard_{i:05d}.faiss"


def build_sharded(
    chunks_from: ChunkSource,
    out_dir: str | os.PathLike,
    dim: int,
    spec: IndexSpec,
    shard_size: int = 1_000_000,
    train_sample: np.ndarray | None = None,
    total: int | None = None,
    progress: bool = True,
) -> dict:
    """Build (or resume building) a sharded index from a restartable stream of embedding chunks.

    Args:
        chunks_from: `chunks_from(start)` yields (n, dim) float32 unit-vector chunks from corpus row `start` on.
        out_dir: folder for `shard_*.faiss`, `progress.json`, `trained.faiss` and, last, `shards.json`.
        dim: embedding dimension.
        spec: index kind and parameters.
        shard_size: rows per shard file (the last shard may be smaller).
        train_sample: vectors to train IVF/IVF-PQ on (required for those kinds on a fresh build).
        total: corpus rows, only for the progress bar.
        progress: show a progress bar.

    Returns:
        The manifest (also written to `shards.json`): spec, dim, ntotal, shards [{file, offset, ntotal}].

    Raises:
        ValueError: the folder holds a build with another spec/dim, or IVF training data is missing.
    """
    faiss = _faiss()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if (out / MANIFEST_FILE).is_file():
        manifest = json.loads((out / MANIFEST_FILE).read_text())
        if manifest["spec"] == asdict(spec) and manifest["dim"] == dim:
            logger.info("sharded index %s is complete (%d vectors)", out, manifest["ntotal"])
            return manifest
        raise ValueError(f"{out} holds a finished index with another spec/dim; delete the folder to rebuild")
    state = {"spec": asdict(spec), "dim": dim, "shard_size": shard_size, "rows_done": 0, "shards": []}
    if (out / PROGRESS_FILE).is_file():
        saved = json.loads((out / PROGRESS_FILE).read_text())
        if {k: saved[k] for k in ("spec", "dim", "shard_size")} != {
            k: state[k] for k in ("spec", "dim", "shard_size")
        }:
            raise ValueError(f"{out}/{PROGRESS_FILE} is from a build with other settings; delete {out} to restart")
        state = saved
        logger.info("resuming %s at row %d (%d shards done)", out, state["rows_done"], len(state["shards"]))
    if spec.needs_training and not (out / TRAINED_FILE).is_file():
        if train_sample is None:
            raise ValueError(f"IndexSpec kind {spec.kind!r} needs `train_sample` (e.g. 100k corpus vectors)")
        empty = make_index(dim, spec)
        train_index(empty, train_sample)
        _write_index(empty, out / TRAINED_FILE)

    def new_shard():
        index = faiss.read_index(str(out / TRAINED_FILE)) if spec.needs_training else make_index(dim, spec)
        return to_gpu(index) if spec.kind != "hnsw" else index

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=state["rows_done"], unit="vec", desc=f"index {out.name}")
    start = time.perf_counter()
    shard, in_shard = new_shard(), 0

    def commit() -> None:
        nonlocal shard, in_shard
        i = len(state["shards"])
        _write_index(shard, out / shard_name(i))
        state["shards"].append({"file": shard_name(i), "offset": state["rows_done"], "ntotal": in_shard})
        state["rows_done"] += in_shard
        _write_json(out / PROGRESS_FILE, state)  # after the shard file: a listed shard always exists
        shard, in_shard = new_shard(), 0

    for chunk in chunks_from(state["rows_done"]):
        chunk = np.ascontiguousarray(chunk, dtype=np.float32)
        if chunk.ndim != 2 or chunk.shape[1] != dim:
            raise ValueError(f"embedding chunk of shape {chunk.shape}; expected (n, {dim})")
        while len(chunk):
            take = min(len(chunk), shard_size - in_shard)
            shard.add(chunk[:take])
            in_shard += take
            chunk = chunk[take:]
            if bar is not None:
                bar.update(take)
            if in_shard == shard_size:
                commit()
    if in_shard:
        commit()
    if bar is not None:
        bar.close()
    manifest = {
        "spec": state["spec"],
        "dim": dim,
        "ntotal": state["rows_done"],
        "shards": state["shards"],
        "build_seconds_last_run": round(time.perf_counter() - start, 2),
    }
    _write_json(out / MANIFEST_FILE, manifest)
    logger.info("built %s: %d vectors in %d shards", out, manifest["ntotal"], len(manifest["shards"]))
    return manifest


def merge_topk(scores: list[np.ndarray], ids: list[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-shard (nq, k_i) results (ids already global) into the global top-k, best first; -1 pads."""
    s = np.concatenate(scores, axis=1)
    i = np.concatenate(ids, axis=1)
    s = np.where(i < 0, -np.inf, s)
    k = min(k, s.shape[1])
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    top_s = np.take_along_axis(s, order, axis=1)
    top_i = np.take_along_axis(i, order, axis=1)
    top_i[np.isneginf(top_s)] = -1
    return top_s.astype(np.float32), top_i


class ShardedIndex:
    """Several FAISS index files searched as one: each shard answers top-k and the answers are merged."""

    def __init__(self, shards: list, offsets: list[int]) -> None:
        self.shards = shards
        self.offsets = offsets

    @property
    def ntotal(self) -> int:
        return sum(s.ntotal for s in self.shards)

    @classmethod
    def load(
        cls,
        index_dir: str | os.PathLike,
        mmap: bool = False,
        gpu: bool = True,
        ef_search: int | None = None,
        nprobe: int | None = None,
    ) -> ShardedIndex:
        """Load a finished sharded index.

        Args:
            index_dir: a folder written by `build_sharded`.
            mmap: memory-map the shard files (`faiss.IO_FLAG_MMAP`) instead of reading them into RAM.
            gpu: move shards to the GPU when GPU FAISS and a GPU are present (a no-op otherwise).
            ef_search: HNSW efSearch override; default from the build spec.
            nprobe: IVF nprobe override; default from the build spec.
        """
        faiss = _faiss()
        index_dir = Path(index_dir)
        path = index_dir / MANIFEST_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"{str(path)!r} is missing: the sharded build in {str(index_dir)!r} is "
                "unfinished or absent; re-run the build (it resumes)"
            )
        manifest = json.loads(path.read_text())
        spec = IndexSpec(**manifest["spec"])
        overrides = {k: v for k, v in (("ef_search", ef_search), ("nprobe", nprobe)) if v is not None}
        spec = IndexSpec(**{**asdict(spec), **overrides})
        shards, offsets = [], []
        for entry in manifest["shards"]:
            file = index_dir / entry["file"]
            if not file.is_file():
                raise FileNotFoundError(f"shard {str(file)!r} listed in {str(path)!r} is missing; rebuild the index")
            index = faiss.read_index(str(file), faiss.IO_FLAG_MMAP if mmap else 0)
            set_query_params(index, spec)
            shards.append(to_gpu(index) if gpu else index)
            offsets.append(int(entry["offset"]))
        return cls(shards, offsets)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (scores, global ids) over all shards for a batch of unit query vectors."""
        q = np.ascontiguousarray(queries, dtype=np.float32)
        all_s, all_i = [], []
        for index, offset in zip(self.shards, self.offsets, strict=True):
            s, i = index.search(q, min(k, max(index.ntotal, 1)))
            all_s.append(s)
            all_i.append(np.where(i >= 0, i + offset, -1))
        return merge_topk(all_s, all_i, k)
