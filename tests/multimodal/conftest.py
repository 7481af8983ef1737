"""Fixtures for the multimodal tests: tiny CLIP options, media KB configs, a tiny Qwen2.5-VL built once."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "data" / "demo"
TINY_CLIP = {"clip_model": "kbrouter-tiny-clip", "clip_pretrained": None}


@pytest.fixture
def kb_config(tmp_path):
    """Return a factory of media `KBConfig`s indexed under `tmp_path` (tiny random CLIP unless options say so)."""
    from retrievers.config import KBConfig

    def make(kind: str, corpus, name: str | None = None, **options) -> KBConfig:
        return KBConfig(
            name=name or kind,
            display_name=f"{kind.title()} Retriever",
            kind=kind,
            granularity=kind,
            corpus=corpus,
            search="dense",
            index_dir=tmp_path / "index" / (name or kind),
            options={**TINY_CLIP, **options},
        )

    return make


@pytest.fixture(scope="session")
def tiny_vl_dir(tmp_path_factory) -> str:
    """A tiny random Qwen2.5-VL with its processor, built offline once per session."""
    from agent.backends.tiny_vl import build_tiny_qwen2_5_vl

    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-vl") / "model")


@pytest.fixture(scope="session")
def tiny_vl_policy(tiny_vl_dir):
    from agent.backends.hf_vl import VisionLanguagePolicy

    return VisionLanguagePolicy(tiny_vl_dir, max_images=2)
