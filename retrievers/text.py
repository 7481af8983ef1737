"""Text KBs: passages (`granularity: paragraph`) or whole documents (`document`) from a JSONL corpus.

Searched densely (sentence-transformers/FlagEmbedding + FAISS), with BM25, or hybrid by reciprocal-rank fusion;
the searching itself is `retrievers.store.IndexedRetriever`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from retrievers.chunking import passages, read_text_corpus
from retrievers.config import KBConfig
from retrievers.store import write_index

logger = logging.getLogger(__name__)


def build_text_index(cfg: KBConfig, out_dir: Path, progress: bool = True) -> dict:
    """Chunk the corpus of a text KB and write its index into `out_dir`.

    Returns:
        Manifest fields (`dim`, `doc_count`, `embedded_texts`, `source_docs`).
    """
    records = list(read_text_corpus(cfg.corpus))
    docs, embed_texts = passages(records, cfg.name, cfg.granularity, cfg.chunk_words)
    logger.info("KB %s: %d records -> %d %s units", cfg.name, len(records), len(docs), cfg.granularity)
    info = write_index(cfg, out_dir, docs, embed_texts, bm25_texts=embed_texts, progress=progress)
    return {**info, "source_docs": len(records)}
