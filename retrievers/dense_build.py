"""Resumable dense builds for text and table KBs: encode in chunks, then index them in FAISS shards.

`build_chunk` texts are encoded at a time into `<index_dir>.partial/vectors/<i>.npy` (each written to a temporary
name and renamed), so a build killed at any moment keeps every finished chunk; the next `kbrouter index` with the
same texts and encoder re-encodes only the missing chunks. The FAISS build (`retrievers.faiss_index.build_sharded`)
then streams the chunks from disk into shards (memory: one chunk and one shard), resumable in the same way. The
chunk boundaries are fixed by `build_chunk`, so a resumed build writes the same vectors and index as an
uninterrupted one. The `.partial` folder is removed once the index is complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np

from retrievers.config import KBConfig
from retrievers.faiss_index import (
    MANIFEST_FILE,
    IndexSpec,
    build_sharded,
    capped_nlist,
    progress_bar,
    shard_name,
)

logger = logging.getLogger(__name__)

FAISS_FILE = "dense.faiss"  # one shard: the plain file every FAISS KB has
SHARDS_DIR = "dense_shards"  # several: shard files + shards.json, searched through faiss.IndexShards
KEY_FILE = "key.json"
# texts -> (n, dim) unit vectors
EncodeFn = Callable[[list[str]], np.ndarray]


def partial_dir(cfg: KBConfig) -> Path:
    """Where an unfinished build of `cfg` keeps its encoded chunks (beside the index folder, never inside it)."""
    index_dir = Path(cfg.index_dir)
    return index_dir.with_name(f"{index_dir.name}.partial")


@contextlib.contextmanager
def build_lock(work: Path) -> Iterator[None]:
    """Hold `<work>.lock` while a build uses `work`: a second build of the same KB waits instead of sharing it."""
    work.parent.mkdir(parents=True, exist_ok=True)
    with work.with_name(work.name + ".lock").open("w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.warning("another process is building %s; waiting for it", work)
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def vectors_key(cfg: KBConfig, texts: list[str]) -> str:
    """What the encoded chunks depend on: the encoder, its settings, the chunk size and every text."""
    h = hashlib.sha256()
    ident = [cfg.encoder, cfg.encoder_backend, cfg.options.get("pooling"), cfg.build_chunk, len(texts)]
    h.update(json.dumps(ident).encode())
    for t in texts:
        h.update(t.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


def encode_in_chunks(
    texts: list[str], encode: EncodeFn, work: Path, key: str, chunk: int, progress: bool = True
) -> list[Path]:
    """Encode `texts` `chunk` at a time into `work/vectors/<i>.npy`, skipping chunks a killed run finished.

    Returns:
        The chunk files, in text order.
    """
    vectors = work / "vectors"
    key_path = work / KEY_FILE
    if key_path.is_file() and json.loads(key_path.read_text()).get("key") != key:
        logger.info("%s is from other texts or another encoder; starting over", work)
        shutil.rmtree(work)
    vectors.mkdir(parents=True, exist_ok=True)
    key_path.write_text(json.dumps({"key": key}))
    starts = list(range(0, len(texts), chunk))
    files = [vectors / f"{i:05d}.npy" for i in range(len(starts))]
    done = sum(f.is_file() for f in files)
    if done:
        logger.info("resuming: %d of %d encoded chunks kept in %s", done, len(files), vectors)
    with progress_bar(progress, f"encode {work.name}", len(texts), min(len(texts), done * chunk)) as advance:
        for start, path in zip(starts, files, strict=True):
            if path.is_file():
                continue
            part = np.ascontiguousarray(encode(texts[start : start + chunk]), dtype=np.float32)
            tmp = path.with_name(path.name + ".tmp")
            with tmp.open("wb") as f:
                np.save(f, part)
            tmp.replace(path)
            advance(len(part))
    return files


def read_rows(files: list[Path], start: int = 0) -> Iterator[np.ndarray]:
    """The rows of the chunk files from global row `start` on, one (memory-mapped) chunk at a time."""
    offset = 0
    for path in files:
        block = np.load(path, mmap_mode="r")
        if offset + len(block) > start:
            yield np.asarray(block[max(0, start - offset) :])
        offset += len(block)


def even_rows(n_rows: int, size: int) -> np.ndarray:
    """`size` row numbers spread evenly over `n_rows` (deterministic), to train IVF cells on."""
    return np.unique(np.linspace(0, n_rows - 1, num=min(size, n_rows)).astype(np.int64))


def sample_rows(files: list[Path], n_rows: int, size: int) -> np.ndarray:
    """The `even_rows` of the chunk files."""
    want = even_rows(n_rows, size)
    out, offset = [], 0
    for path in files:
        block = np.load(path, mmap_mode="r")
        local = want[(want >= offset) & (want < offset + len(block))] - offset
        out.append(np.asarray(block[local]))
        offset += len(block)
    return np.concatenate(out)


def index_spec(cfg: KBConfig, n: int) -> IndexSpec:
    """The FAISS spec a KB config asks for, with IVF cells capped for `n` vectors."""
    return IndexSpec(
        kind=cfg.index,
        hnsw_m=cfg.hnsw_m,
        ef_construction=cfg.hnsw_ef_construction,
        ef_search=cfg.hnsw_ef_search,
        nlist=capped_nlist(cfg.ivf_nlist, min(n, cfg.train_sample)),
        nprobe=cfg.nprobe,
        pq_m=cfg.pq_m,
        pq_bits=cfg.pq_bits,
        refine=cfg.refine,
        refine_k_factor=cfg.refine_k_factor,
    )


def build_faiss_dense(
    cfg: KBConfig,
    out_dir: Path,
    files: list[Path],
    n_docs: int,
    dim: int,
    work: Path,
    pooled: np.ndarray | None = None,
    progress: bool = True,
) -> None:
    """Index the encoded chunks (or the per-doc `pooled` vectors) into `out_dir`: `dense.faiss` or `dense_shards/`."""
    spec = index_spec(cfg, n_docs)
    if spec.nlist < cfg.ivf_nlist and spec.needs_training:
        logger.warning("ivf_nlist %d capped to %d for %d vectors", cfg.ivf_nlist, spec.nlist, n_docs)
    shard_size = math.ceil(n_docs / cfg.shards)
    tag = hashlib.sha256(json.dumps([asdict(spec), shard_size]).encode()).hexdigest()[:12]
    faiss_work = work / f"faiss-{tag}"

    def chunks_from(start: int) -> Iterator[np.ndarray]:
        if pooled is not None:
            yield pooled[start:]
        else:
            yield from read_rows(files, start)

    sample = None
    if spec.needs_training:
        rows = even_rows(n_docs, cfg.train_sample)
        sample = pooled[rows] if pooled is not None else sample_rows(files, n_docs, cfg.train_sample)
    manifest = build_sharded(chunks_from, faiss_work, dim, spec, shard_size, sample, n_docs, progress)
    # linked, not moved: a build killed after this point finds the finished shards where build_sharded left them
    if len(manifest["shards"]) == 1:
        _link(faiss_work / shard_name(0), out_dir / FAISS_FILE)
        return
    target = out_dir / SHARDS_DIR
    target.mkdir()
    for name in [entry["file"] for entry in manifest["shards"]] + [MANIFEST_FILE]:
        _link(faiss_work / name, target / name)


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or no hard links there
        shutil.copy2(src, dst)
