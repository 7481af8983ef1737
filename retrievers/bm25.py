"""BM25 over a KB's units with `bm25s` (sparse, numpy scoring); saved beside the dense index."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

BM25_DIR = "bm25"
STOPWORDS = "en"


def _bm25s():
    try:
        import bm25s
    except ImportError as e:
        raise ImportError("BM25 retrieval needs bm25s: pip install bm25s (a core kbrouter dependency)") from e
    # bm25s pins its logger to DEBUG at import, which floods any app that configures root logging at INFO.
    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


def tokenize(texts: list[str]) -> list[list[str]]:
    """Lower-case word tokens without English stopwords (bm25s' scikit-learn-style tokenizer)."""
    return _bm25s().tokenize(texts, stopwords=STOPWORDS, return_ids=False, show_progress=False)


def build_bm25_index(texts: list[str], out_dir: Path) -> Path:
    """Index `texts` (row i = unit i) with BM25 and save under `out_dir/bm25`."""
    bm25s = _bm25s()
    retriever = bm25s.BM25()
    retriever.index(tokenize(texts), show_progress=False)
    path = Path(out_dir) / BM25_DIR
    retriever.save(str(path))
    return path


class BM25Index:
    """A loaded BM25 index; `search` returns unit ids and scores per query."""

    def __init__(self, retriever) -> None:
        self._retriever = retriever
        self._vocab = retriever.vocab_dict
        self.size = int(retriever.scores["num_docs"])

    @classmethod
    def load(cls, index_dir: Path) -> BM25Index:
        """Load the BM25 index saved by `build_bm25_index` under `index_dir`."""
        path = Path(index_dir) / BM25_DIR
        if not path.is_dir():
            raise FileNotFoundError(f"BM25 index {str(path)!r} is missing; rebuild the KB index")
        return cls(_bm25s().BM25.load(str(path)))

    def search(self, queries: list[str], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Top-k (ids, scores) per query; queries with no indexed word, and zero-score units, give nothing."""
        tokens = [[t for t in q if t in self._vocab] for q in tokenize(queries)]
        results: list[tuple[np.ndarray, np.ndarray]] = [(np.zeros(0, int), np.zeros(0, np.float32))] * len(queries)
        live = [i for i, t in enumerate(tokens) if t]
        if not live:
            return results
        k = max(1, min(k, self.size))
        ids, scores = self._retriever.retrieve([tokens[i] for i in live], k=k, show_progress=False)
        for row, i in enumerate(live):
            keep = scores[row] > 0
            results[i] = (ids[row][keep], scores[row][keep])
        return results
