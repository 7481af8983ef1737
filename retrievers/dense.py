"""FAISS inner-product indexes over L2-normalised embeddings: exact (flat), HNSW or IVF."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

FAISS_FILE = "dense.faiss"


def _faiss():
    try:
        import faiss
    except ImportError as e:
        raise ImportError(
            "dense retrieval needs FAISS: pip install faiss-cpu (a core kbrouter dependency; or 'kbrouter[gpu]' for faiss-gpu)"
        ) from e
    return faiss


def build_faiss_index(
    embeddings: np.ndarray,
    index_type: str = "flat",
    hnsw_m: int = 32,
    hnsw_ef_construction: int = 40,
    ivf_nlist: int = 1024,
):
    """Build a FAISS inner-product index over unit vectors.

    Args:
        embeddings: (n, dim) float32, L2-normalised, so inner product is cosine similarity.
        index_type: `flat` (exact; right for up to ~100k vectors), `hnsw` or `ivf`.
        hnsw_m: HNSW graph degree.
        hnsw_ef_construction: HNSW build-time beam width.
        ivf_nlist: IVF cell count; capped at n/39 so every cell gets FAISS's minimum of training points.

    Returns:
        The populated `faiss.Index`.
    """
    faiss = _faiss()
    x = np.ascontiguousarray(embeddings, dtype=np.float32)
    n, dim = x.shape
    if index_type == "flat":
        index = faiss.IndexFlatIP(dim)
    elif index_type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = hnsw_ef_construction
    elif index_type == "ivf":
        nlist = max(1, min(ivf_nlist, n // 39))
        if nlist < ivf_nlist:
            logger.warning("ivf_nlist %d capped to %d for %d vectors", ivf_nlist, nlist, n)
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(x)
    else:
        raise ValueError(f"unknown index type {index_type!r}; use flat, hnsw or ivf")
    index.add(x)
    return index


def save_faiss_index(index, out_dir: Path) -> Path:
    """Write the index to `out_dir/dense.faiss`."""
    path = Path(out_dir) / FAISS_FILE
    _faiss().write_index(index, str(path))
    return path


def load_faiss_index(index_dir: Path, ef_search: int = 64, nprobe: int = 16, mmap: bool = False):
    """Read `dense.faiss` and apply the query-time parameters (HNSW efSearch, IVF nprobe)."""
    faiss = _faiss()
    path = Path(index_dir) / FAISS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"dense index {str(path)!r} is missing; rebuild the KB index")
    try:
        index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP if mmap else 0)
    except RuntimeError:
        if not mmap:
            raise
        logger.warning("%s: FAISS cannot memory-map this index type; reading it whole", path)
        index = faiss.read_index(str(path))
    if isinstance(index, faiss.IndexHNSW):
        index.hnsw.efSearch = ef_search
    elif isinstance(index, faiss.IndexIVF):
        index.nprobe = nprobe
    return index


def dense_search(index, query_embeddings: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Search a batch of unit query vectors; returns (scores, ids), ids are -1 where fewer than k exist."""
    k = max(1, min(k, index.ntotal))
    return index.search(np.ascontiguousarray(query_embeddings, dtype=np.float32), k)
