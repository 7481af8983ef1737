"""Large local FAISS indexes on FAISS's own parts, plus the one thing FAISS lacks: resumable chunked builds.

FAISS does the indexing: `faiss.index_factory` makes every kind (`Flat`, `HNSW32,Flat`, `IVF4096,Flat`,
`IVF4096,PQ48x8,RFlat`), `faiss.ParameterSpace` sets query-time knobs (nprobe, efSearch, the refine k-factor)
through wrappers and shards, `faiss.IndexShards` searches shard files as one index, and `faiss.IO_FLAG_MMAP`
maps them instead of reading them. kbrouter adds `build_sharded`: vectors arrive in chunks from a restartable
source, shard files are committed one by one with `progress.json`, and `shards.json` is written last, so an
interrupted build resumes at the last committed shard and a folder without `shards.json` is never loaded::

    spec = IndexSpec(kind="ivfpq", nlist=4096, pq_m=48, refine="flat")
    build_sharded(lambda start: vector_chunks(start), out_dir, dim=384, spec=spec,
                  shard_size=1_000_000, train_sample=sample)     # re-running it resumes an interrupted build
    index = load_sharded(out_dir, mmap=True)                      # a faiss.IndexShards when there are several
    scores, ids = index.search(query_vectors, 10)                 # global row ids, best first

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
REFINE_KINDS = {"none": "", "flat": ",RFlat", "fp16": ",Refine(SQfp16)", "sq8": ",Refine(SQ8)"}
PROGRESS_FILE = "progress.json"
MANIFEST_FILE = "shards.json"
TRAINED_FILE = "trained.faiss"
MIN_POINTS_PER_CELL = 39  # FAISS's k-means warns below this many training points per IVF cell
# Yields float32 (n, dim) embedding chunks starting at corpus row `start` (so an interrupted build can resume).
ChunkSource = Callable[[int], Iterator[np.ndarray]]


def _faiss():
    try:
        import faiss
    except ImportError as e:
        raise ImportError("FAISS indexes need faiss: pip install faiss-cpu (a core kbrouter dependency)") from e
    return faiss


@dataclass(frozen=True)
class IndexSpec:
    """Which FAISS index to build and its parameters (build-time ones change the files; query-time ones do not)."""

    kind: str = field(default="flat", metadata={"help": "flat | hnsw | ivf | ivfpq"})
    hnsw_m: int = field(default=32, metadata={"help": "HNSW graph degree (build)."})
    ef_construction: int = field(default=40, metadata={"help": "HNSW efConstruction (build)."})
    ef_search: int = field(default=64, metadata={"help": "HNSW efSearch (query)."})
    nlist: int = field(default=1024, metadata={"help": "IVF cells (build; wants >= 39 training points each)."})
    nprobe: int = field(default=16, metadata={"help": "IVF cells visited per query (query)."})
    pq_m: int = field(default=48, metadata={"help": "IVF-PQ sub-quantizers (build; must divide dim)."})
    pq_bits: int = field(default=8, metadata={"help": "IVF-PQ bits per code (build; 4 uses FAISS fast-scan)."})
    refine: str = field(default="none", metadata={"help": "IVF-PQ re-ranking store: none|flat|fp16|sq8 (build)."})
    refine_k_factor: int = field(default=4, metadata={"help": "candidates re-ranked per hit (query)."})

    def __post_init__(self) -> None:
        if self.kind not in INDEX_KINDS:
            raise ValueError(f"IndexSpec `kind` {self.kind!r} is unknown; use one of {', '.join(INDEX_KINDS)}")
        if self.refine not in REFINE_KINDS:
            raise ValueError(f"IndexSpec `refine` {self.refine!r} is unknown; use one of {', '.join(REFINE_KINDS)}")
        if self.refine != "none" and self.kind != "ivfpq":
            raise ValueError(f"IndexSpec `refine` {self.refine!r} is for kind ivfpq, not {self.kind!r}")
        for key in ("hnsw_m", "ef_construction", "ef_search", "nlist", "nprobe", "pq_m", "pq_bits", "refine_k_factor"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"IndexSpec `{key}` must be a positive integer, got {value!r}")

    @property
    def needs_training(self) -> bool:
        return self.kind in ("ivf", "ivfpq")

    def factory_string(self, dim: int) -> str:
        """The `faiss.index_factory` description of this index."""
        if self.kind == "flat":
            return "Flat"
        if self.kind == "hnsw":
            return f"HNSW{self.hnsw_m},Flat"
        if self.kind == "ivf":
            return f"IVF{self.nlist},Flat"
        if dim % self.pq_m:
            raise ValueError(f"IndexSpec `pq_m` ({self.pq_m}) must divide the dimension {dim}; e.g. pq_m: {dim // 8}")
        codes = f"PQ{self.pq_m}x4fs" if self.pq_bits == 4 else f"PQ{self.pq_m}x{self.pq_bits}"
        return f"IVF{self.nlist},{codes}{REFINE_KINDS[self.refine]}"

    def query_params(self) -> dict[str, int]:
        """The `faiss.ParameterSpace` settings this kind reads at query time."""
        if self.kind == "hnsw":
            return {"efSearch": self.ef_search}
        if self.kind == "ivf":
            return {"nprobe": self.nprobe}
        if self.kind == "ivfpq":
            return {"nprobe": self.nprobe, **({"k_factor_rf": self.refine_k_factor} if self.refine != "none" else {})}
        return {}


def capped_nlist(nlist: int, n: int) -> int:
    """IVF cells for `n` training vectors: at most `nlist`, and few enough that each cell gets 39 points."""
    return max(1, min(nlist, n // MIN_POINTS_PER_CELL))


def make_index(dim: int, spec: IndexSpec):
    """An empty (untrained) inner-product index of `spec` made by `faiss.index_factory`."""
    faiss = _faiss()
    index = faiss.index_factory(dim, spec.factory_string(dim), faiss.METRIC_INNER_PRODUCT)
    if spec.kind == "hnsw":
        index.hnsw.efConstruction = spec.ef_construction
    return index


def set_query_params(index, spec: IndexSpec) -> None:
    """Apply the query-time parameters (efSearch, nprobe, refine k-factor) through wrappers and shards alike."""
    space = _faiss().ParameterSpace()
    for name, value in spec.query_params().items():
        space.set_index_parameter(index, name, value)


def train_index(index, sample: np.ndarray) -> None:
    """Train an IVF/IVF-PQ index on a sample of the corpus vectors (a no-op for flat and HNSW)."""
    if index.is_trained:
        return
    index.train(np.ascontiguousarray(sample, dtype=np.float32))


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def _write_index(index, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    _faiss().write_index(index, str(tmp))
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

    Memory: one chunk and one open shard.

    Args:
        chunks_from: `chunks_from(start)` yields (n, dim) float32 unit-vector chunks from corpus row `start` on.
        out_dir: folder for `shard_*.faiss`, `progress.json`, `trained.faiss` and, last, `shards.json`.
        dim: embedding dimension.
        spec: index kind and parameters.
        shard_size: rows per shard file (the last shard may be smaller).
        train_sample: vectors to train IVF/IVF-PQ on (required for those kinds on a fresh build).
        total: corpus rows, only for the progress bar.
        progress: show a progress bar (rich).

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
    settings = ("spec", "dim", "shard_size")
    if (out / PROGRESS_FILE).is_file():
        saved = json.loads((out / PROGRESS_FILE).read_text())
        if {k: saved[k] for k in settings} != {k: state[k] for k in settings}:
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
        return faiss.read_index(str(out / TRAINED_FILE)) if spec.needs_training else make_index(dim, spec)

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

    with _progress(progress, f"index {out.name}", total, state["rows_done"]) as advance:
        for chunk in chunks_from(state["rows_done"]):
            chunk = np.ascontiguousarray(chunk, dtype=np.float32)
            if chunk.ndim != 2 or chunk.shape[1] != dim:
                raise ValueError(f"embedding chunk of shape {chunk.shape}; expected (n, {dim})")
            while len(chunk):
                take = min(len(chunk), shard_size - in_shard)
                shard.add(chunk[:take])
                in_shard += take
                chunk = chunk[take:]
                advance(take)
                if in_shard == shard_size:
                    commit()
        if in_shard:
            commit()
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


class _progress:
    """A rich progress bar as a context manager yielding `advance(n)`; a no-op when disabled."""

    def __init__(self, enabled: bool, description: str, total: int | None, done: int = 0) -> None:
        self.enabled, self.description, self.total, self.done = enabled, description, total, done
        self._bar = None

    def __enter__(self) -> Callable[[int], None]:
        if not self.enabled:
            return lambda n: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        self._bar = Progress("{task.description}", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        self._bar.start()
        task = self._bar.add_task(self.description, total=self.total, completed=self.done)
        return lambda n: self._bar.advance(task, n)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def progress_bar(enabled: bool, description: str, total: int | None, done: int = 0) -> _progress:
    """A rich progress bar (`with progress_bar(...) as advance: advance(n)`), silent when `enabled` is False."""
    return _progress(enabled, description, total, done)


def load_sharded(index_dir: str | os.PathLike, mmap: bool = False, **query_overrides: int):
    """Load a finished sharded index: its one shard, or a `faiss.IndexShards` over all of them.

    Args:
        index_dir: a folder written by `build_sharded`.
        mmap: memory-map the shard files (`faiss.IO_FLAG_MMAP`) instead of reading them into RAM.
        **query_overrides: IndexSpec query-time fields (`nprobe`, `ef_search`, `refine_k_factor`).

    Raises:
        FileNotFoundError: the build is unfinished (no `shards.json`) or a listed shard file is missing.
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
    spec = IndexSpec(**{**manifest["spec"], **{k: v for k, v in query_overrides.items() if v is not None}})
    shards = []
    for entry in manifest["shards"]:
        file = index_dir / entry["file"]
        if not file.is_file():
            raise FileNotFoundError(f"shard {str(file)!r} listed in {str(path)!r} is missing; rebuild the index")
        shards.append(faiss.read_index(str(file), faiss.IO_FLAG_MMAP if mmap else 0))
    if len(shards) == 1:
        index = shards[0]
    else:
        # successive_ids: shard i's row j is global row offset_i + j, the order the shards were built in
        index = faiss.IndexShards(manifest["dim"], True, True)
        for shard in shards:
            index.add_shard(shard)  # FAISS's wrapper keeps a reference, so the shard outlives this loop
    set_query_params(index, spec)
    return index
