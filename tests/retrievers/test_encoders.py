"""Encoder loading: the bundled MiniLM, normalised output, and the guarded FlagEmbedding backend."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from retrievers.encoders import install_flagembedding_shim, load_encoder, normalize, resolve_encoder_path


def test_minilm_resolves_to_bundled_folder():
    path = Path(resolve_encoder_path("minilm"))
    assert (path / "config.json").is_file()
    assert resolve_encoder_path("BAAI/bge-m3") == "BAAI/bge-m3"  # other names pass through untouched


def test_minilm_encodes_unit_vectors():
    enc = load_encoder("minilm")
    assert enc.dim == 384
    vectors = enc.encode(["The Eiffel Tower is in Paris.", "Paris has the Eiffel Tower.", "Bananas are yellow."])
    assert vectors.dtype == np.float32 and vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    # paraphrases are closer than unrelated text
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3
    assert enc.encode([]).shape == (0, 384)


def test_normalize_keeps_zero_rows():
    np.testing.assert_allclose(normalize(np.array([[3.0, 4.0], [0.0, 0.0]])), [[0.6, 0.8], [0.0, 0.0]])


def test_flagembedding_missing_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "FlagEmbedding", None)  # makes `import FlagEmbedding` fail
    with pytest.raises(ImportError, match=r"pip install 'kbrouter\[bge\]'"):
        load_encoder("minilm", backend="flagembedding")


def test_flagembedding_shim_provides_the_four_names():
    # on transformers 5 the module is gone and the shim supplies it; on 4.x the real module already has the names
    install_flagembedding_shim()
    module = importlib.import_module("transformers.modeling_attn_mask_utils")
    for attr in ("AttentionMaskConverter", "_prepare_4d_attention_mask", "_prepare_4d_causal_attention_mask",
                 "_prepare_4d_causal_attention_mask_for_sdpa"):  # fmt: skip
        assert hasattr(module, attr), attr


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown encoder backend 'onnx'"):
        load_encoder("minilm", backend="onnx")
