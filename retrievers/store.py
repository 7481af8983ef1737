"""The on-disk index shared by text and table KBs (docs + FAISS + BM25) and the retriever that searches it.

Layout of an index folder::

    docs.jsonl      one `Doc.to_dict()` per unit, line i = unit i
    dense.faiss     FAISS index over unit vectors (search: dense | hybrid), or
    dense_shards/   several FAISS shard files + shards.json (`shards: N`), searched through faiss.IndexShards
    bm25/           bm25s index over unit texts (search: bm25 | hybrid)
    manifest.json   written last by `retrievers.kb.build_kb`

With `index: milvus` the units, their vectors and BM25 live in a Milvus collection instead (`retrievers.milvus`)
and the folder holds only the manifest. Dense encoding is chunked and resumable (`retrievers.dense_build`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
from pathlib import Path

import numpy as np

from retrievers.bm25 import BM25Index, build_bm25_index
from retrievers.config import KBConfig
from retrievers.dense import dense_search, load_faiss_index
from retrievers.dense_build import (
    SHARDS_DIR,
    build_faiss_dense,
    build_lock,
    encode_in_chunks,
    index_spec,
    partial_dir,
    vectors_key,
)
from retrievers.encoders import EncodeFn, Encoder, encoding_pool, load_encoder, normalize
from retrievers.faiss_index import load_sharded, set_query_params
from retrievers.fusion import reciprocal_rank_fusion
from retrievers.jsonl import iter_jsonl_objects, write_jsonl_atomic
from retrievers.types import Doc, Hit, Query, text_queries

logger = logging.getLogger(__name__)

DOCS_FILE = "docs.jsonl"


def encoder_for(cfg: KBConfig) -> Encoder:
    """Load (or reuse) the encoder a KB config names."""
    return load_encoder(cfg.encoder, cfg.encoder_backend, cfg.device, cfg.batch_size, cfg.options.get("pooling"))


def pool(vectors: np.ndarray, groups: list[int], n: int) -> np.ndarray:
    """Mean-pool rows of `vectors` that share a group id (0..n-1), then renormalise to unit length."""
    out = np.zeros((n, vectors.shape[1]), dtype=np.float32)
    np.add.at(out, np.asarray(groups), vectors)
    return normalize(out)


def read_docs(index_dir: str | os.PathLike, kb: str) -> list[Doc]:
    """The docs of an index folder (`docs.jsonl`), each tagged with the name of its KB."""
    return [
        dataclasses.replace(Doc.from_dict(row), kb=kb) for _, row in iter_jsonl_objects(Path(index_dir) / DOCS_FILE)
    ]


def write_index(
    cfg: KBConfig,
    out_dir: Path,
    docs: list[Doc],
    embed_texts: list[str],
    bm25_texts: list[str],
    groups: list[int] | None = None,
    progress: bool = True,
) -> dict:
    """Write docs, dense and/or BM25 indexes for one KB into `out_dir`.

    Args:
        cfg: the KB (its `search`, `index` and encoder settings are used).
        out_dir: existing folder to write into.
        docs: the retrievable units, in index order.
        embed_texts: texts to embed; one per doc, or several per doc with `groups`.
        bm25_texts: one text per doc for BM25.
        groups: for each embed text, the index of its doc; their vectors are mean-pooled per doc.
        progress: show a progress bar while encoding.

    Returns:
        Manifest fields: `dim` (0 without a dense index), `doc_count`, `embedded_texts`.
    """
    if not docs:
        raise ValueError(f"KB {cfg.name!r}: corpus {str(cfg.corpus)!r} yielded no documents")
    if cfg.index == "milvus":
        from retrievers.milvus import sync_collection

        encoder = encoder_for(cfg) if cfg.search != "bm25" else None
        with contextlib.ExitStack() as stack:
            encode = lazy_pool(stack, encoder, cfg) if encoder is not None else None
            return sync_collection(cfg, docs, embed_texts, bm25_texts, groups, encoder, encode, progress)
    write_jsonl_atomic(out_dir / DOCS_FILE, (doc.to_dict() for doc in docs))
    dim = 0
    if cfg.search in ("dense", "hybrid"):
        with build_lock(partial_dir(cfg)):
            dim = write_dense(cfg, out_dir, len(docs), embed_texts, groups, progress)
    if cfg.search in ("bm25", "hybrid"):
        assert len(bm25_texts) == len(docs)
        build_bm25_index(bm25_texts, out_dir)
    return {"dim": dim, "doc_count": len(docs), "embedded_texts": len(embed_texts)}


def write_dense(
    cfg: KBConfig, out_dir: Path, n_docs: int, embed_texts: list[str], groups: list[int] | None, progress: bool
) -> int:
    """Encode in resumable chunks, index them into `out_dir` and drop the chunks; returns the dimension."""
    encoder = encoder_for(cfg)
    work = partial_dir(cfg)
    with contextlib.ExitStack() as stack:
        encode = lazy_pool(stack, encoder, cfg)
        files = encode_in_chunks(embed_texts, encode, work, vectors_key(cfg, embed_texts), cfg.build_chunk, progress)
    pooled = None
    if groups is not None:  # tables: one vector per table, the mean of its row chunks
        pooled = pool(np.concatenate([np.load(f) for f in files]), groups, n_docs)
    build_faiss_dense(cfg, out_dir, files, n_docs, encoder.dim, work, pooled, progress)
    shutil.rmtree(work, ignore_errors=True)  # the index is complete: the resumable chunks are not needed
    return encoder.dim


def lazy_pool(stack: contextlib.ExitStack, encoder: Encoder, cfg: KBConfig) -> EncodeFn:
    """An encode function that starts `cfg.encode_workers` encoder processes on first use (a build resumed after
    its last chunk encodes nothing and starts none); `stack` stops them."""
    fn: EncodeFn | None = None

    def encode(texts: list[str]) -> np.ndarray:
        nonlocal fn
        if fn is None:
            fn = stack.enter_context(encoding_pool(encoder, cfg.encode_workers, cfg.device))
        return fn(texts)

    return encode


class IndexedRetriever:
    """Searches one KB's index folder with dense, BM25 or hybrid (RRF) ranking. Satisfies `Retriever`."""

    def __init__(self, cfg: KBConfig, docs: list[Doc], encoder: Encoder | None, dense, bm25: BM25Index | None):
        self.cfg = cfg
        self.name = cfg.name
        self.docs = docs
        self._encoder = encoder
        self._dense = dense
        self._bm25 = bm25

    @classmethod
    def load(cls, cfg: KBConfig) -> IndexedRetriever:
        """Load the index folder `cfg.index_dir` (the caller checks the manifest first)."""
        index_dir = Path(cfg.index_dir)
        docs = read_docs(index_dir, cfg.name)
        encoder = dense = bm25 = None
        if cfg.search in ("dense", "hybrid"):
            if (index_dir / SHARDS_DIR).is_dir():
                dense = load_sharded(index_dir / SHARDS_DIR, mmap=cfg.mmap)
            else:
                dense = load_faiss_index(index_dir, mmap=cfg.mmap)
            set_query_params(dense, index_spec(cfg, dense.ntotal))
            encoder = encoder_for(cfg)
        if cfg.search in ("bm25", "hybrid"):
            bm25 = BM25Index.load(index_dir)
        return cls(cfg, docs, encoder, dense, bm25)

    def __len__(self) -> int:
        return len(self.docs)

    def search(self, queries: list[str | Query], k: int | None = None) -> list[list[Hit]]:
        """Top-k hits per query, best first; an empty query gets an empty list.

        Args:
            queries: query strings or `Query`s (a query image is ignored by text and table KBs).
            k: hits per query; defaults to the KB's `k`. Larger than the KB is fine.

        Returns:
            One list of `Hit`s per query, with `kb` set to this KB's name and 0-based ranks.
        """
        k = k or self.cfg.k
        live, live_texts = text_queries(queries)
        results: list[list[Hit]] = [[] for _ in queries]
        if not live:
            return results
        depth = max(k, self.cfg.fusion_depth) if self.cfg.search == "hybrid" else k
        dense_lists = self._search_dense(live_texts, depth) if self._dense is not None else None
        bm25_lists = self._search_bm25(live_texts, depth) if self._bm25 is not None else None
        for j, i in enumerate(live):
            if dense_lists is not None and bm25_lists is not None:
                hits = reciprocal_rank_fusion([dense_lists[j], bm25_lists[j]], k=self.cfg.rrf_k)
            else:
                hits = dense_lists[j] if dense_lists is not None else bm25_lists[j]
            results[i] = hits[:k]
        return results

    def _hits(self, ids, scores) -> list[Hit]:
        pairs = [(int(d), float(s)) for d, s in zip(ids, scores, strict=True) if d >= 0]
        return [Hit(doc=self.docs[d], score=s, rank=r, kb=self.name) for r, (d, s) in enumerate(pairs)]

    def _search_dense(self, texts: list[str], k: int) -> list[list[Hit]]:
        vectors = self._encoder.encode(texts)  # one batched call for all queries
        scores, ids = dense_search(self._dense, vectors, k)
        return [self._hits(ids[j], scores[j]) for j in range(len(texts))]

    def _search_bm25(self, texts: list[str], k: int) -> list[list[Hit]]:
        return [self._hits(ids, scores) for ids, scores in self._bm25.search(texts, k)]
